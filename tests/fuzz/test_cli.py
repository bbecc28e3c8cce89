"""Command lines drawn from each tool's own parser (tests.fuzz.argvs), run in the bounded
child: exit 0 or 1 (a verdict) or 2 with one line on stderr, no traceback, no hang, and the
user's files exactly as they were."""

from __future__ import annotations

import pytest
from hypothesis import given

from tests.fuzz.argvs import SPECS, argvs
from tests.fuzz.checks import check_cli, fuzz_settings

pytestmark = pytest.mark.fuzz

# examples per tool (short run, tox -e fuzz); a valid run costs 0.1 to 5 seconds
BUDGET = {"gradcheck": (5, 2400), "optcheck": (5, 2400), "mnist-train": (4, 1800),
          "mnist-eval": (5, 2400), "mnist-regress": (3, 1200)}


def _test(tool: str):
    short, long = BUDGET[tool]

    @fuzz_settings(short=short, long=long)
    @given(argv=argvs(tool))
    def test(fuzz_env, argv):
        check_cli(fuzz_env, tool, argv)

    test.__name__ = f"test_{tool.replace('-', '_')}_command_line"
    test.__doc__ = f"`{tool}` on drawn command lines."
    return test


test_gradcheck_command_line = _test("gradcheck")
test_optcheck_command_line = _test("optcheck")
test_mnist_train_command_line = _test("mnist-train")
test_mnist_eval_command_line = _test("mnist-eval")
test_mnist_regress_command_line = _test("mnist-regress")


@pytest.mark.parametrize("tool", sorted(SPECS))
def test_base_command_line_is_a_valid_cheap_run(fuzz_env, tool):
    """The base every drawn command line starts from runs and passes."""
    argv = []
    for flag, value in SPECS[tool].base:
        argv += [x for x in (flag, value) if x]
    assert check_cli(fuzz_env, tool, argv) == 0
