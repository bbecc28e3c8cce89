"""Generated cases: hypothesis draws cases from each op's strategy, and shrinks a failure.

`gradcheck --op OP --random N --seed S` checks N cases per op drawn from the strategy that
lives beside the op's samples. When one fails, hypothesis shrinks it to a minimal failing
case, which is reported with a one-line command that reproduces it (`gradcheck --repro`).
"""

from __future__ import annotations

import ast
import shlex

from engine.registry import get_op
from engine.samples import InputSpec, Sample
from gradcheck.check import check_sample
from reports import Result


class _CaseFailed(Exception):
    def __init__(self, result: Result, case):
        super().__init__(result.message)
        self.result = result
        self.case = case


def repro_command(case) -> str:
    """The one-line command that re-runs exactly this case."""
    return f"gradcheck --repro {shlex.quote(repr(case))}"


def parse_case(text: str) -> Sample:
    """A Sample from its repr (as printed by repro_command); ValueError on anything else.

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


def generated_results(op_name: str, n: int, seed: int, dtype: str = "all", mode="auto",
                      backend="cpu", inject=None, use_torch=True) -> list[Result]:
    """N generated cases of one op, then, if one failed, its shrunk minimal case."""
    op = get_op(op_name)
    if op.strategy is None:
        return [Result("gradcheck", f"{op_name}(generated)", "skip",
                       message="no strategy for generated cases", labels={"op": op_name})]
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    dtypes = ["f32", "f64"] if dtype == "all" else [dtype]
    drawn: list[Result] = []
    first_failure: list[Result] = []

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(dtypes).flatmap(op.strategy))
    def prop(case):
        result = check_sample(case, inject, mode, backend, use_torch)
        if not first_failure:
            drawn.append(result)
        if not result.ok:
            first_failure.append(result)
            raise _CaseFailed(result, case)

    try:
        prop()
    except _CaseFailed as exc:
        minimal = exc.result
        minimal.labels["generated"] = "minimal"
        minimal.message += f"; reproduce: {repro_command(exc.case)}"
        return drawn + [minimal]
    return drawn
