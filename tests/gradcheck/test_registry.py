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


@pytest.mark.parametrize("op", checkable_ops())
def test_every_case_passes_and_can_fail(op):
    rows = check_ops([op], tier="all")
    assert rows
    bad = [f"{r.status}: {r.name}: {r.message}" for r in rows
           if r.status not in ("pass", "skip")]
    assert not bad, "\n".join(bad)
