"""Generated cases: hypothesis draws cases from each op's strategy, and shrinks a failure.

`gradcheck --op OP --random N --seed S` checks N cases per op drawn from the strategy that
lives beside the op's samples, in the engine under test (`--engine`: ours by default; an
isolated engine runs them in one worker process, restarted after each crash). The first
case that fails, errs or crashes ends the drawing; hypothesis shrinks it to a smaller
failing case, which is reported with a one-line command that reproduces it in the same
engine, e.g. `gradcheck --engine ggml --repro "Sample(op='pool_2d', ...)"` (see
gradcheck.repro).

- Cases the engine cannot run (its `unsupported` gives a reason, e.g. ggml and f64) are
  assumed away: they count neither as drawn cases nor as failures. One `unsupported` row,
  `OP(generated)`, says how many were drawn and why; when no drawn case was supported it is
  the only row.
- Every case is checked once: its verdict is remembered by its repr, so that hypothesis
  sees the same answer when it meets the case again (a non-deterministic crash must not
  read as a flaky test) and a duplicate costs nothing.
- Shrinking is bounded: at most `shrink_checks` new cases and `shrink_seconds` seconds
  (each check costs a case, each crash a worker restart). Past the budget, candidates are
  not checked (assumed away) and the smallest failing case so far is reported, its message
  saying that shrinking stopped early.
"""

from __future__ import annotations

import collections
import copy
import time

from checkkit.raised import SignalWatch
from engine.registry import get_op
from engine.tensor import FLOAT_NAMES
from gradcheck.check import check_case, op_labels
from gradcheck.engine_under_test import EngineUnderTest
from gradcheck.repro import FAILING, with_repro
from reports import Result

SHRINK_CHECKS = 150      # new cases checked while shrinking a failure
SHRINK_SECONDS = 45.0    # seconds of shrinking, after which the best case so far stands
REASONS_SHOWN = 3        # distinct reasons of unsupported draws named in the summary row


class _CaseFailed(Exception):
    def __init__(self, result: Result, case):
        super().__init__(result.message)
        self.result = result
        self.case = case


class _Search:
    """The state of one hypothesis run: verdicts by case, drawn rows, unsupported draws and
    the shrink budget."""

    def __init__(self, adapter, mode, use_torch, shrink_checks, shrink_seconds,
                 ad="rev", order=1):
        self.adapter, self.mode, self.use_torch = adapter, mode, use_torch
        self.ad, self.order = ad, order
        self.shrink_checks, self.shrink_seconds = shrink_checks, shrink_seconds
        self.verdicts: dict[str, list[Result]] = {}
        self.drawn: list[Result] = []
        self.unsupported: collections.Counter[str] = collections.Counter()
        self.shrink_started: float | None = None    # set at the first failure
        self.shrunk = 0                              # cases checked while shrinking
        self.budget_spent = False

    def _over_budget(self) -> bool:
        if self.shrink_started is None:
            return False
        spent = (self.shrunk >= self.shrink_checks
                 or time.perf_counter() - self.shrink_started >= self.shrink_seconds)
        self.budget_spent |= spent
        return spent

    def verdict(self, case) -> list[Result] | None:
        """The case's rows (gradcheck.check.check_case: one per mode asked for), checked
        once; None when it is not to be checked (the engine cannot run it, or the shrink
        budget is spent)."""
        key = repr(case)
        if key in self.verdicts:
            return self.verdicts[key]
        reason = self._unsupported(case)
        if reason:
            if self.shrink_started is None:
                self.unsupported[reason] += 1
            return None
        if self._over_budget():
            return None
        rows = check_case(case, self.ad, self.order, mode=self.mode,
                          use_torch=self.use_torch, adapter=self.adapter)
        self.verdicts[key] = rows
        if self.shrink_started is None:
            self.drawn += [self.with_repro(row, case, ()) for row in rows]
            if not all(row.ok for row in rows):
                self.shrink_started = time.perf_counter()
        else:
            self.shrunk += 1
        return rows

    def with_repro(self, row, case, in_message):
        """`row` with the command that re-runs `case` in its mode (gradcheck.repro)."""
        return with_repro(row, case, self.adapter, self.mode, by_repr=True,
                          in_message=in_message,
                          ad="fwd" if row.labels.get("ad") == "fwd" else "rev",
                          order=2 if row.labels.get("order") == "2" else 1)

    def _unsupported(self, case) -> str | None:
        """The adapter's reason not to run `case`, as a str; None when it has none, or
        when asking raises (anything but the user's Ctrl-C): check_sample asks again and
        makes that the case's error row."""
        with SignalWatch() as watch:
            try:
                reason = self.adapter.unsupported(case)
                return str(reason) if reason else None
            except BaseException as exc:
                watch.reraise(exc)
                return None

    def summary(self, op_name: str, engine: str) -> Result | None:
        """The `unsupported` row of the draws the engine could not run (None if none)."""
        if not self.unsupported:
            return None
        total = sum(self.unsupported.values())
        reasons = "; ".join(f"{n}x {why}" for why, n in
                            self.unsupported.most_common(REASONS_SHOWN))
        more = len(self.unsupported) - REASONS_SHOWN
        if more > 0:
            reasons += f"; and {more} other reasons"
        return Result("gradcheck", f"{op_name}(generated)", "unsupported",
                      {"unsupported_draws": total, "checked_draws": len(self.drawn)},
                      f"{total} drawn cases not run ({engine} cannot run them; assumed "
                      f"away, not counted): {reasons}",
                      labels=op_labels(op_name, engine) | {"generated": "unsupported"})


def _minimal(result: Result, case, search: _Search) -> Result:
    """The shrunk case's row: a copy (the same case may be a drawn row too), labelled
    `generated: minimal`, with the number of cases checked while shrinking
    (`shrink_checks`), its message ending in the repro command."""
    row = copy.deepcopy(result)
    row.labels["generated"] = "minimal"
    row.metrics["shrink_checks"] = search.shrunk
    if search.budget_spent:
        row.message += (f"; shrinking stopped at its budget ({search.shrink_checks} cases or "
                        f"{search.shrink_seconds:g} s): a smaller failing case may exist")
    return search.with_repro(row, case, FAILING)


def generated_results(op_name: str, n: int, seed: int, dtype: str = "all", engine=None, *,
                      backend: str = "cpu", mode: str = "auto", use_torch: bool = True,
                      shrink_checks: int = SHRINK_CHECKS,
                      shrink_seconds: float = SHRINK_SECONDS, ad: str = "rev",
                      order: int = 1) -> list[Result]:
    """N generated cases of one op in `engine` (an EngineUnderTest, an adapter, or None:
    ours; ours runs on `backend`, with the engine's mutation), then, if one failed, errored
    or crashed, its shrunk case (labelled generated: minimal), and an `unsupported` row for
    draws the engine cannot run. An isolated adapter runs every case in one worker process
    (the engine's case_timeout: seconds per engine call there); a crash is a failing case,
    and the next case restarts the worker. `ad` and `order`: the modes each drawn case is
    checked in (gradcheck.check.check_case); a case fails when any of its rows does."""
    op = get_op(op_name)
    if op.strategy is None:
        return [Result("gradcheck", f"{op_name}(generated)", "skip",
                       message="no strategy for generated cases", labels={"op": op_name})]
    engine, own = EngineUnderTest.of(engine)
    if not engine.ours and backend != "cpu":
        raise ValueError("backend applies to our engine only, not to engine "
                         f"{engine.adapter.name!r}")
    try:
        return _search(op, n, seed, dtype, mode, use_torch, engine.on_backend(backend),
                       shrink_checks, shrink_seconds, ad, order)
    finally:
        if own:
            engine.close()


def _search(op, n, seed, dtype, mode, use_torch, adapter, shrink_checks, shrink_seconds,
            ad, order):
    # hypothesis is imported here, not at the top: a sweep without --random never pays for it
    from hypothesis import HealthCheck, Phase, assume, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    dtypes = list(FLOAT_NAMES) if dtype == "all" else [dtype]
    search = _Search(adapter, mode, use_torch, shrink_checks, shrink_seconds, ad, order)

    @hseed(seed)
    @settings(max_examples=n, deadline=None, database=None, derandomize=False,
              phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(dtypes).flatmap(op.strategy))
    def prop(case):
        rows = search.verdict(case)
        assume(rows is not None)
        failing = [row for row in rows if not row.ok]
        if failing:
            raise _CaseFailed(failing[0], case)

    minimal: list[Result] = []
    try:
        prop()
    except _CaseFailed as exc:
        minimal.append(_minimal(exc.result, exc.case, search))
    except Unsatisfiable:       # no drawn case was one the engine runs: the summary says why
        pass
    summary = search.summary(op.name, adapter.name)
    return search.drawn + minimal + ([summary] if summary else [])
