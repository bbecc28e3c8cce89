"""Repro commands: the one line that re-runs a case in the same engine, and its way back.

A failing, erroring or crashing row carries `repro` (`with_repro`): a registry sample is
named by op and filter, `gradcheck --engine ggml --op pool_2d -k '<case>'`; any other Sample
(a generated case, a shrunk one) by its repr, `gradcheck --engine ggml --repro
"Sample(op='pool_2d', ...)"`, which `parse_case` turns back into the Sample without
evaluating anything.
"""

from __future__ import annotations

import ast
import shlex

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.adapters import spec_of
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.cotangents import tier_cases

# adapter options that the gradcheck CLI can say, and how
OPTION_FLAGS = {"backend": "--backend", "inject": "--inject", "lib_dir": "--ggml-lib",
                "n_threads": "--ggml-threads"}
_DEFAULT_OPTIONS = {"backend": "cpu"}
FAILING = ("fail", "error", "crash")    # the statuses of rows that are not ok


def _is_registry_sample(case) -> bool:
    try:
        op = get_op(case.op)
    except Exception:
        return False
    return str(case) in {str(s) for s in tier_cases(op, getattr(case, "tier", "fast"))}


def repro_command(case, adapter, mode: str = "auto", by_repr: bool = False) -> str | None:
    """The one-line gradcheck command that re-runs exactly this case in this engine, e.g.
    `gradcheck --engine ggml --op pool_2d -k '<case>'` for a registry sample, or
    `gradcheck --engine ggml --repro 'Sample(...)'` for any other Sample (and any Sample
    when `by_repr`, as for generated cases); None for a case the CLI cannot name (a
    user's function)."""
    if isinstance(case, Sample) and not by_repr and _is_registry_sample(case):
        what = ["--op", case.op, "-k", str(case)]
        if case.tier == "scale":
            what[2:2] = ["--tier", "scale"]
    elif isinstance(case, Sample):
        what = ["--repro", repr(case)]
    else:
        return None
    spec = spec_of(adapter)
    words = ["gradcheck"] + ([] if spec.name == EngineAdapter.name else ["--engine", spec.name])
    for key, value in spec.options:
        if key in OPTION_FLAGS and value is not None and _DEFAULT_OPTIONS.get(key) != value:
            words += [OPTION_FLAGS[key], str(value)]
    words += what + ([] if mode == "auto" else ["--mode", mode])
    return " ".join(_shell_word(w) for w in words)


def _shell_word(word: str) -> str:
    """`word` quoted for a POSIX shell: as shlex.quote does, except that a word holding
    single quotes (a case's repr) and nothing a shell expands inside double quotes goes in
    double quotes, which read better than shlex's '"'"' splices."""
    if "'" in word and not set(word) & set('"$`\\!'):
        return f'"{word}"'
    return shlex.quote(word)


def with_repro(result, case, adapter, mode: str, by_repr: bool = False,
               in_message: tuple[str, ...] = ("crash",)):
    """`result` (changed in place and returned) with its repro command in metrics["repro"]
    when it failed, erred or crashed and the CLI can name the case (see repro_command);
    a row whose status is in `in_message` also ends its message with "; reproduce: CMD"."""
    if result.status not in FAILING:
        return result
    command = repro_command(case, adapter, mode, by_repr)
    if command:
        result.metrics["repro"] = command
        if result.status in in_message:
            result.message += f"; reproduce: {command}"
    return result


def parse_case(text: str) -> Sample:
    """A Sample from its repr (as printed in a repro command); ValueError on anything else.

    Only the constructors Sample and InputSpec with literal arguments are accepted: the text
    is parsed, never evaluated."""
    constructors = {"Sample": Sample, "InputSpec": InputSpec}

    def build(node):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in constructors:
            args = [build(a) for a in node.args]
            kwargs = {k.arg: build(k.value) for k in node.keywords}
            return constructors[node.func.id](*args, **kwargs)
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(build(e) for e in node.elts)
        return ast.literal_eval(node)

    try:
        case = build(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError) as exc:
        raise ValueError(f"not a case: {exc}") from None
    if not isinstance(case, Sample):
        raise ValueError("not a case: expected Sample(...)")
    get_op(case.op)   # an unknown op raises UnknownOpError
    return case
