"""The registry under its own checker: every case of every op, fast and scale tiers, in our
engine on the CPU, passes, and none is vacuous (`gradcheck --all --tier all --strict`),
one test per op so that pytest-xdist spreads them. A vacuous case is a check that could
not have failed (a zero reference gradient, a cotangent in the VJP's null space, a
tolerance that swallows the gradient): its sample generator needs fixing."""

from __future__ import annotations

import pytest

import engine  # noqa: F401  (registers the ops)
from gradcheck.request import check_ops
from gradcheck.runner import checkable_ops

# run after the other tests, alone (tox.ini): two cores busy for minutes
pytestmark = pytest.mark.registry


@pytest.mark.parametrize("op", checkable_ops())
def test_every_case_passes_and_can_fail(op):
    # in this process: the verdicts are the isolated worker's (tests/gradcheck/
    # test_isolated_engine.py holds the two alike), and a worker started per op cost 3-4 s
    # each, over 3 minutes of CI in all; a crash still fails the test (xdist reports it)
    rows = check_ops([op], tier="all", no_isolate=True)
    assert rows
    bad = [f"{r.status}: {r.name}: {r.message}" for r in rows
           if r.status not in ("pass", "skip")]
    assert not bad, "\n".join(bad)


# the reasons a row may pass an injected 10% error in every gradient (gradcheck --all
# --inject scale:1.1): nothing to differentiate, a derivative that is 0 by definition
# (held to exact zeros instead), a propagation case (NaN and infinite inputs: its forward
# alone is checked), or a measured power above 10% (which makes a row vacuous in float32
# and float64, so none is left there)
EXEMPT = {"skip": "no gradient", "zero": "zero by definition",
          "propagation": "a propagation case: its forward alone is checked"}


def exemption(row) -> str | None:
    """Why `row` may pass under --inject scale:1.1, or None."""
    if row.status == "skip":
        return EXEMPT["skip"]
    if "zero by definition" in row.message:
        return EXEMPT["zero"]
    if row.labels.get("check") == "propagation":
        return EXEMPT["propagation"]
    if row.metrics.get("power", 0.0) > 0.1:
        return f"its power is {row.metrics['power']:.0%}"
    return None


@pytest.mark.parametrize("op", checkable_ops())
def test_an_injected_ten_percent_error_fails_every_row_that_is_not_exempt(op):
    """The injection reaches every row (the backward rules of the case's ops and the
    outputs of the dedicated backward ops): in float64 each row fails, or says why not."""
    rows = check_ops([op], dtype="f64", inject="scale:1.1")
    passed = [f"{r.name}: {r.status}: {r.message}" for r in rows
              if r.status not in ("fail",) and exemption(r) is None]
    assert not passed, "\n".join(passed)
