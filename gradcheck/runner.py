"""Select sample cases from the registry and check them in an engine."""

from __future__ import annotations

import contextlib
import shlex

from tqdm import tqdm

from engine.registry import all_ops, get_op
from engine.samples import Sample
from gradcheck.adapters import spec_of
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.check import check_sample
from gradcheck.worker import DEFAULT_CASE_TIMEOUT, IsolatedAdapter

DTYPES = ("f32", "f64")
# adapter options that the gradcheck CLI can say, and how
OPTION_FLAGS = {"backend": "--backend", "inject": "--inject", "lib_dir": "--ggml-lib"}
_DEFAULT_OPTIONS = {"backend": "cpu"}


def select_samples(op_names, dtype: str = "all", pattern: str | None = None):
    """The registry's samples of `op_names` (unknown names raise UnknownOpError), of one
    dtype or both, whose string contains `pattern`."""
    samples = []
    for name in op_names:
        op = get_op(name)
        samples += list(op.samples()) if op.samples else []
    if dtype != "all":
        samples = [s for s in samples if s.dtype == dtype]
    if pattern:
        samples = [s for s in samples if pattern in str(s)]
    return samples


def checkable_ops() -> list[str]:
    """Ops with sample cases, less the dedicated backward ops: they have no gradient of
    their own and are checked through their forward op (`--op NAME` still runs them)."""
    return [name for name, op in all_ops().items() if op.samples and op.kind != "backward"]


def _is_registry_sample(case) -> bool:
    try:
        op = get_op(case.op)
    except Exception:
        return False
    return bool(op.samples) and str(case) in {str(s) for s in op.samples()}


def repro_command(case, adapter, mode: str = "auto", by_repr: bool = False) -> str | None:
    """The one-line gradcheck command that re-runs exactly this case in this engine, e.g.
    `gradcheck --engine ggml --op pool_2d -k '<case>'` for a registry sample, or
    `gradcheck --engine ggml --repro 'Sample(...)'` for any other Sample (and any Sample
    when `by_repr`, as for generated cases); None for a case the CLI cannot name (a
    user's function)."""
    if isinstance(case, Sample) and not by_repr and _is_registry_sample(case):
        what = ["--op", case.op, "-k", str(case)]
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


def _with_repro(result, case, adapter, mode):
    """A failing, erroring or crashing row gets its repro command (metrics["repro"]; a crash
    row's message names it too)."""
    if result.status not in ("fail", "error", "crash"):
        return result
    command = repro_command(case, adapter, mode)
    if command:
        result.metrics["repro"] = command
        if result.status == "crash":
            result.message += f"; reproduce: {command}"
    return result


def run_checks(samples, inject: str | None = None, progress: bool = False, mode="auto",
               backends=("cpu",), use_torch: bool = True, adapter=None,
               case_timeout: float = DEFAULT_CASE_TIMEOUT):
    """Check every sample; a list of Results in the same order. The engine is `adapter`, or
    by default ours on every backend of `backends` with the mutation `inject` in place.
    An adapter with `isolated` set runs in one worker process shared by all cases (a fresh
    one after a crash); `case_timeout`: seconds an engine call may take there."""
    if adapter is None:
        engines = [EngineAdapter(b, inject) for b in backends]
    elif inject or tuple(backends) != ("cpu",):
        raise ValueError("inject and backends apply to our engine only, not to engine "
                         f"{adapter.name!r}")
    else:
        engines = [adapter]
    jobs = [(s, e) for s in samples for e in engines]
    with contextlib.ExitStack() as stack:
        running = {}
        for e in engines:
            running[id(e)] = e
            if e.isolated and not isinstance(e, IsolatedAdapter):
                running[id(e)] = stack.enter_context(IsolatedAdapter(e, case_timeout))
        it = tqdm(jobs, desc="gradcheck", unit="case", disable=not progress, leave=False)
        return [_with_repro(check_sample(s, mode=mode, use_torch=use_torch,
                                         adapter=running[id(e)]), s, e, mode)
                for s, e in it]
