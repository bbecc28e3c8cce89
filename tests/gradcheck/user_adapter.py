"""Users' adapter modules for the tests (`gradcheck --engine module:A`): the numpy relu they
answer with, a template of the whole module with a statement of the test's in each method,
and the module written where it is importable."""

from __future__ import annotations

RELU = '''
import numpy as np
from gradcheck.adapters.base import VJP


def relu(arrays, weights):
    """relu's output and the gradient of sum(output * weights), in numpy."""
    (x,) = arrays
    w = np.asarray(weights).astype(x.dtype)
    return VJP(np.maximum(x, 0), [w * (x > 0)])
'''

# the adapter class's head: its name, whether isolated, a statement in each of __init__ and
# describe (format slots; the methods that follow are the template's own)
ADAPTER_HEAD = '''
class A:
    name = "{name}"
    isolated = {isolated}

    def __init__(self):
        {init}

    def describe(self):
        {describe}
'''

MODULE = RELU + '''

class Boom(BaseException):
    """An adapter's own BaseException."""


def bad(case):
    return "{bad}" in str(case)


{top}
''' + ADAPTER_HEAD + '''
    def unsupported(self, case):
        if case.op not in ("relu", "clamp_back"):
            return "relu only"
        {unsupported}
        return None

    def vjp(self, case, arrays, weights):
        {vjp}
        return relu(arrays, weights)
'''


def adapter_source(*, bad="x=[3,4]", top="", isolated=False, init="pass",
                   describe="return 'mine 1.0'", unsupported="pass", vjp="pass") -> str:
    """MODULE with the statements given: `top` at module level, the others in their methods;
    `bad(case)`: the case's text holds `bad`."""
    return MODULE.format(name="mine", bad=bad, top=top, isolated=isolated, init=init,
                         describe=describe, unsupported=unsupported, vjp=vjp)


def write_module(tmp_path, monkeypatch, name: str, source: str) -> str:
    """The module `name` with `source`, written in tmp_path and importable (here, and in a
    worker started after); its engine name, `name:A`."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:A"
