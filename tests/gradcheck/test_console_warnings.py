"""Warnings from the console scripts (each tool's console module, around
checkkit.console.launch): one line each, opening with the command's name, with the category
where it says something; never Python's two lines with a source path. Run as the scripts
run: in a process of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from tests.console_scripts import script_call

ADAPTER = '''
import os, warnings
import numpy as np
from gradcheck.adapters.base import VJP

warnings.warn("adapter module imported")


class A:
    name = "warns"
    isolated = {isolated}

    def describe(self):
        return "warns 1.0"

    def unsupported(self, case):
        return None if case.op == "relu" else "relu only"

    def vjp(self, case, arrays, weights):
        warnings.warn("the adapter's vjp\\nwarns over two lines")
        np.exp(np.float64(1e5))                 # RuntimeWarning: overflow encountered in exp
        if {dies} and "x=[3,4]" in str(case):
            os.abort()
        (x,) = arrays
        w = np.asarray(weights).astype(x.dtype)
        return VJP(np.maximum(x, 0), [w * (x > 0)])
'''


def _console(tool: str, argv, prelude: str = "", cwd=None, timeout=240):
    """The console script `tool` (its entry point in pyproject.toml) on `argv`, in
    a process of its own, after `prelude`; the finished process."""
    code = prelude + textwrap.dedent(f"""
        import sys
        sys.argv = [{tool!r}, *{list(argv)!r}]
        """) + script_call(tool)
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def _python_format(stderr: str) -> list[str]:
    """Lines of stderr in Python's own warning format (a source path and line, or the
    source line under it)."""
    return [line for line in stderr.splitlines()
            if ".py:" in line or line.startswith("  ") or "warnings.warn(" in line]


def test_an_adapters_warnings_are_one_line_each_with_the_tools_name(tmp_path):
    (tmp_path / "gv_warns.py").write_text(ADAPTER.format(isolated=False, dies=False))
    done = _console("gradcheck", ["--engine", "gv_warns:A", "--op", "relu", "--dtype", "f64",
                                  "--no-torch", "--no-progress"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _python_format(done.stderr) == []
    assert done.stderr.splitlines() == [
        "gradcheck: warning: adapter module imported",
        "gradcheck: engine under test: warns 1.0",
        "gradcheck: warning: the adapter's vjp warns over two lines",
        "gradcheck: warning: RuntimeWarning: overflow encountered in exp"]


def test_a_workers_warnings_reach_a_crash_row_in_one_line(tmp_path):
    """An isolated adapter's worker writes its stderr to a log, whose tail a crash row
    quotes: its warnings are one line there too."""
    (tmp_path / "gv_warns_dies.py").write_text(ADAPTER.format(isolated=True, dies=True))
    out = tmp_path / "r.json"
    done = _console("gradcheck", ["--engine", "gv_warns_dies:A", "--op", "relu", "--dtype",
                                  "f64", "-k", "x=[3,4])", "--no-torch", "--no-progress",
                                  "--format", "json", "--output", str(out)], cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    (crash,) = json.loads(out.read_text())["results"]
    assert crash["status"] == "crash"
    assert ("stderr: warning: UserWarning: the adapter's vjp warns over two lines | "
            "warning: RuntimeWarning: overflow encountered in exp") in crash["message"]
    assert ".py:" not in crash["message"].split("; at ")[0]


# an import hook that warns when the command line's module is imported (before its main)
WARN_AT_IMPORT = """
import importlib.abc, sys, warnings
class Warns(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("gradcheck.cli", "optcheck.cli", "mnist_target.cli"):
            warnings.warn("a library warns\\nwhile importing", FutureWarning)
            warnings.warn("and says so plainly")
        return None
sys.meta_path.insert(0, Warns())
"""


@pytest.mark.parametrize("tool", ["gradcheck", "optcheck", "mnist-train", "mnist-eval",
                                  "mnist-regress"])
def test_warnings_before_main_runs_are_one_line_with_the_commands_name(tool):
    done = _console(tool, ["--help"], prelude=WARN_AT_IMPORT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"{tool}: warning: FutureWarning: a library warns while importing",
        f"{tool}: warning: and says so plainly"]


def test_warning_line_keeps_an_informative_category_only():
    from checkkit.usage import warning_line
    from engine.backends.cpu.environment import SettingWarning
    assert warning_line("optcheck", "x\n  y", RuntimeWarning) == \
        "optcheck: warning: RuntimeWarning: x y"
    assert warning_line("gradcheck", "plain", UserWarning) == "gradcheck: warning: plain"
    assert warning_line("gradcheck", "ours", SettingWarning) == "gradcheck: warning: ours"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn("mine", DeprecationWarning, stacklevel=1)
    (w,) = seen
    assert warning_line("mnist-train", w.message, w.category) == \
        "mnist-train: warning: DeprecationWarning: mine"


def test_a_passing_run_over_infinities_warns_nothing():
    """diag_mask_inf's output holds -inf, and its expanded cotangent makes our float64
    reference sum -inf with +inf (numpy's reduction warned "invalid value", a stray line
    in every `gradcheck --all`): IEEE arithmetic on infinities is no warning."""
    done = _console("gradcheck", ["--op", "diag_mask_inf", "--dtype", "f32", "-k",
                                  "cotangent=expanded", "--no-progress"])
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr, done.stderr
