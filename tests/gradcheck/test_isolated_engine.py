"""Our own engine in a worker process: a crash of the engine under test is a crash row
naming the case and the report is written; under --boundscheck an out-of-bounds index is an
error row naming the kernel; an isolated run gives the verdicts of one in this process.

The planted bug (tests.gradcheck.planted_oob: relu's float32 CPU kernel writes 2**36
elements past its output) lives only in the worker processes of a `gradcheck` run in a
subprocess (tests.gradcheck.planted_run): never in this one."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import engine
from checkkit import worker as worker_module
from checkkit.isolated import IsolatedAdapter
from engine import ops
from engine.backends.cpu.jit import bindable
from engine.errors import RowIndexError
from engine.executor import KernelError
from engine.mutation.patches import kernel_replaced, scaled
from engine.registry import get_op
from gradcheck import cli
from gradcheck.adapters import get_adapter
from gradcheck.check import check_case, check_sample
from gradcheck.engine_under_test import (
    EngineUnderTest,
    IsolatedEngine,
    boundscheck_cache_dir,
    boundscheck_environ,
)
from gradcheck.mutants import CONTROL, MUTANTS, Mutant
from gradcheck.request import check_ops, run_plan
from gradcheck.runner import run_checks
from gradcheck.selftest import caught_by, mutant_cases, run_mutant
from reports import Result

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLANTED_CASE = "relu(type=f32,x=[3,4])"


def planted_gradcheck(tmp_path, *argv) -> tuple[int, dict | None, str]:
    """`gradcheck ARGV --no-torch --format json` with the planted bug in every worker of
    ours, in a subprocess: (exit status, the report or None, stderr)."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.gradcheck.planted_run", *argv, "--no-torch",
         "--no-progress", "--format", "json", "--output", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    return (done.returncode, json.loads(report.read_text()) if report.exists() else None,
            done.stderr)


def rows_of(report) -> dict[str, dict]:
    return {r["case"]: r for r in report["results"]}


@pytest.fixture(scope="module")
def isolated_run(tmp_path_factory):
    """The planted bug's run with --isolate, on relu's [3,4] cases of every dtype. It also
    puts the unchecked planted kernel in this environment's numba cache, which a
    bounds-checked run must not load."""
    return planted_gradcheck(tmp_path_factory.mktemp("isolated"), "--op", "relu", "-k",
                             "x=[3,4])", "--isolate")


def test_a_planted_out_of_bounds_write_is_a_crash_row_and_the_report_is_written(
        isolated_run):
    status, report, err = isolated_run
    assert status == 1, err
    rows = rows_of(report)
    crash = rows[PLANTED_CASE]
    assert crash["status"] == "crash"
    for words in ("worker killed by SIGSEGV (signal 11) while running vjp_runs",
                  "planted_oob.py", "in run_and_write_past", f"-k '{PLANTED_CASE}'"):
        assert words in crash["message"]
    # the run went on in a fresh worker: the float64 case (no float32 relu) passes
    assert rows["relu(type=f64,x=[3,4])"]["status"] == "pass"
    assert report["summary"]["crashed"] == len(rows) - 1


def test_the_scale_tier_runs_our_engine_isolated_by_default(tmp_path):
    status, report, err = planted_gradcheck(tmp_path, "--op", "relu", "--tier", "scale",
                                            "-k", "type=f32,x=[1031,1031])")
    assert status == 1, err
    (row,) = report["results"]
    assert row["status"] == "crash" and "SIGSEGV" in row["message"]


def test_the_planted_write_under_boundscheck_is_an_error_row_naming_the_kernel(
        isolated_run, tmp_path):
    # isolated_run cached the unchecked kernel: loading it here would crash, not raise
    status, report, err = planted_gradcheck(tmp_path, "--op", "relu", "-k", PLANTED_CASE,
                                            "--boundscheck")
    assert status == 1, err
    assert f"cached in {boundscheck_cache_dir()}" in err
    (row,) = report["results"]
    assert row["status"] == "error", row["message"]
    for words in ("error: KernelError: IndexError in op relu's kernel cpu_relu_writing_past",
                  "(node 'relu_", f"graph '{PLANTED_CASE}'",
                  "planted_oob.py:", "in run_and_write_past: write_past(flat)",
                  "index is out of bounds"):
        assert words in row["message"]


def test_numba_caches_machine_code_without_its_boundscheck(tmp_path):
    """Why a bounds-checked worker caches apart: a process with NUMBA_BOUNDSCHECK=1 loads
    the unchecked code another process cached (numba 0.68's index key is the signature,
    the target and the bytecode). Should numba key it one day, this fails, and the
    separate cache is no longer needed."""
    (tmp_path / "probe.py").write_text(textwrap.dedent("""
        import numba, numpy as np

        @numba.njit(cache=True)
        def read(a, i):
            return a[i]

        try:
            read(np.zeros(16), 16)          # one element past the end: harmless to read
            print("unchecked", read.stats.cache_hits[read.signatures[0]])
        except IndexError:
            print("checked", read.stats.cache_hits[read.signatures[0]])
        """))

    def probe(checked: bool) -> str:
        environ = {k: v for k, v in os.environ.items() if k != "NUMBA_BOUNDSCHECK"}
        environ["NUMBA_CACHE_DIR"] = str(tmp_path / "cache")
        if checked:
            environ["NUMBA_BOUNDSCHECK"] = "1"
        return subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, env=environ,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert probe(checked=False) == "unchecked 0"
    assert probe(checked=True) == "unchecked 1"      # the unchecked code, from the cache


def test_a_bounds_checked_worker_has_a_cache_of_its_own():
    env = boundscheck_environ()
    assert env["NUMBA_BOUNDSCHECK"] == "1"
    assert env["NUMBA_CACHE_DIR"] == boundscheck_cache_dir()
    assert boundscheck_cache_dir({"NUMBA_CACHE_DIR": "/c"}) == "/c/boundscheck"
    assert boundscheck_cache_dir({"XDG_CACHE_HOME": "/x"}) == \
        "/x/gradverify/numba/boundscheck"
    assert boundscheck_cache_dir({"GRADVERIFY_CACHE": "/g"}) == "/g/numba/boundscheck"


def test_a_worker_refuses_numba_variables_it_cannot_set_in_time(monkeypatch):
    """numba is imported in this process: its variables would not take effect."""
    monkeypatch.delenv("NUMBA_BOUNDSCHECK", raising=False)
    problem = worker_module._set_environ({"NUMBA_BOUNDSCHECK": "1"})
    assert "numba was imported before NUMBA_BOUNDSCHECK" in problem
    assert "NUMBA_BOUNDSCHECK" not in os.environ
    monkeypatch.setenv("GRADVERIFY_TEST_VARIABLE", "other")
    assert "GRADVERIFY_TEST_VARIABLE='other' (set to 'mine')" in \
        worker_module._changed({"GRADVERIFY_TEST_VARIABLE": "mine"})


# --- the defaults ---------------------------------------------------------------------------
FAST, SCALE = get_op("relu").samples()[0], get_op("relu").scale()[0]


@pytest.mark.parametrize("options, fast, scale", [
    ({}, False, True),
    ({"isolate": True}, True, True),
    ({"isolate": False}, False, False),
    ({"boundscheck": True}, True, True),
])
def test_which_cases_of_ours_run_in_the_worker(options, fast, scale):
    engine = EngineUnderTest(**options)
    assert (engine.isolates(FAST), engine.isolates(SCALE)) == (fast, scale)
    assert engine.isolates(None) == fast          # a generated case is a fast one


def test_another_engine_is_isolated_when_its_adapter_asks_or_when_told():
    torch = get_adapter("torch")
    assert not EngineUnderTest(torch).isolates(SCALE)
    with EngineUnderTest(torch, isolate=True) as isolated:
        assert isolated.isolates(FAST)
        assert isinstance(isolated.running(), IsolatedAdapter)
        assert [r.status for r in run_checks([FAST], isolated, use_torch=False)] == ["pass"]
    with pytest.raises(ValueError, match="boundscheck apply to our engine only"):
        EngineUnderTest(torch, boundscheck=True)
    with pytest.raises(ValueError, match="not with isolate=False"):
        EngineUnderTest(isolate=False, boundscheck=True)


@pytest.mark.parametrize("argv, isolation", [
    (["--all"], None), (["--all", "--tier", "scale"], None), (["--all", "--isolate"], True),
    (["--all", "--tier", "scale", "--no-isolate"], False), (["--all", "--boundscheck"], None),
])
def test_the_command_line_options_make_the_isolation(argv, isolation):
    request = cli.request_of(cli.build_parser().parse_args(argv))
    assert request.isolation is isolation and request.problem() is None
    engine = request.engine_under_test()
    assert engine.isolates(SCALE) is (isolation is not False)
    assert engine.isolates(FAST) is (isolation is True or request.boundscheck)


@pytest.mark.parametrize("argv, isolate", [([], True), (["--no-isolate"], False),
                                           (["--boundscheck"], True)])
def test_the_self_test_is_isolated_unless_told_not_to(argv, isolate, monkeypatch):
    import gradcheck.selftest
    seen = {}
    monkeypatch.setattr(gradcheck.selftest, "run_self_test",
                        lambda progress, **kwargs: seen.update(kwargs) or [])
    request = cli.request_of(cli.build_parser().parse_args(["--self-test", *argv]))
    with request.plan() as plan:
        run_plan(request, plan)
    assert seen == {"isolate": isolate, "boundscheck": "--boundscheck" in argv}


@pytest.mark.parametrize("argv, says", [
    (["--isolate", "--no-isolate"], "--isolate and --no-isolate contradict each other"),
    (["--boundscheck", "--no-isolate"], "--boundscheck runs our engine in a worker process"),
    (["--boundscheck", "--engine", "torch"], "--boundscheck applies to our engine only"),
    (["--no-isolate", "--engine", "torch"], "--no-isolate applies to our engine only"),
])
def test_isolation_options_that_do_not_fit_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--op", "relu", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err


def test_an_unwritable_boundscheck_cache_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(SystemExit) as info:
        cli.main(["--op", "relu", "--boundscheck"])
    assert info.value.code == 2
    assert "--boundscheck: its kernel cache" in capsys.readouterr().err


# --- an isolated run agrees with one in this process ------------------------------------------
METRICS = ("paths", "threads", "forward", "directions", "max_abs_err", "checked")


def test_scale_cases_isolated_give_the_verdicts_and_paths_of_this_process():
    cases = [get_op("sum").scale()[0], SCALE, get_op("softmax").scale()[0]]
    here = run_checks(cases, EngineUnderTest(isolate=False), use_torch=False)
    with EngineUnderTest() as engine:
        there = run_checks(cases, engine, use_torch=False)
        assert engine.worker().starts == 1
    for a, b in zip(here, there, strict=True):
        assert b.status == a.status == "pass"
        assert {m: b.metrics.get(m) for m in METRICS} == {m: a.metrics.get(m) for m in METRICS}
    assert "split:cpu_relu" in there[1].metrics["paths"]
    assert "numba-parallel: same bits" in there[1].metrics["threads"]


def test_every_method_the_checks_call_runs_in_the_worker():
    """forward (a dedicated backward op), jvp and hvp (forward mode, second order, an
    Unsupported raised there) give the rows they give in this process."""
    cases = [next(s for s in get_op("softmax_back").samples() if s.dtype == "f64"),
             next(s for s in get_op("tanh").samples() if s.dtype == "f64"),
             next(s for s in get_op("softmax").samples() if s.dtype == "f64")]
    with EngineUnderTest(isolate=True) as isolated:
        for case in cases:
            (adapter,) = [r for r, _ in isolated.pairs(case)]
            assert isinstance(adapter, IsolatedEngine)
            there = check_case(case, "both", 2, adapter=adapter, use_torch=False)
            here = check_case(case, "both", 2, use_torch=False)
            assert [(r.name, r.status) for r in there] == [(r.name, r.status) for r in here]
            assert [r.metrics.get("max_abs_err") for r in there] == \
                [r.metrics.get("max_abs_err") for r in here]
        assert {r.status for r in there} == {"pass", "unsupported"}   # softmax's order 2


# --- the self-test, isolated ----------------------------------------------------------------
def test_isolated_mutants_share_one_worker_and_leave_the_references_right():
    """A forward kernel's mutant changes our float64 reference too in this process, so the
    engine's forward agrees with it there; isolated, the reference is right and the
    forward check catches it. The control passes isolated too."""
    name = "sum_reads_permuted_input_as_contiguous"
    cases = mutant_cases(MUTANTS[name])[:2]
    here = run_mutant(MUTANTS[name], cases)
    with EngineUnderTest(isolate=True) as engine:
        there = run_mutant(MUTANTS[name], cases, engine=engine)
        control = run_mutant(CONTROL, mutant_cases(CONTROL)[-2:], engine=engine)
        assert engine.worker().starts == 1
    assert here.status == there.status == "pass"
    assert "forward" not in here.metrics["caught_by"]
    assert "forward" in there.metrics["caught_by"]
    assert control.status == "pass", control.message


def test_an_unregistered_mutant_cannot_be_isolated():
    planted = Mutant("relu_grad_scaled_twice", ("relu",), "not registered",
                     scaled("relu", 2.0))
    with EngineUnderTest(isolate=True) as engine:
        r = run_mutant(planted, [FAST], engine=engine)
    assert r.status == "error" and "is not registered" in r.message


def test_a_crashed_case_is_a_catch():
    assert caught_by(Result("gradcheck", "c", "crash", message="crash: SIGSEGV")) == ["crash"]


# --- the executor names the kernel that raised ----------------------------------------------
def _relu_graph():
    x = engine.input_tensor((3, 4), np.float32, name="x")
    x.set(np.ones((3, 4), np.float32))
    y = ops.relu(x)
    return engine.Graph([y], name="g")


def _raising(error):
    def cpu_relu_raising(out, ins, **params):
        def out_of_bounds():
            raise error
        return out_of_bounds
    return lambda real: bindable(cpu_relu_raising)


def test_a_kernel_that_raises_names_its_op_node_kernel_and_line():
    with kernel_replaced("relu", _raising(IndexError("index is out of bounds"))), \
            pytest.raises(KernelError) as info:
        _relu_graph().compute()
    message = str(info.value)
    assert message.startswith("IndexError in op relu's kernel cpu_relu_raising (node ")
    assert "shape [3, 4], graph 'g') at tests/gradcheck/test_isolated_engine.py:" in message
    assert message.endswith("in out_of_bounds: raise error: index is out of bounds")
    assert isinstance(info.value.__cause__, IndexError)


def test_an_engine_error_from_a_kernel_goes_on_up_as_it_is():
    with kernel_replaced("relu", _raising(RowIndexError("row 7 outside 3 rows"))), \
            pytest.raises(RowIndexError, match="row 7 outside 3 rows"):
        _relu_graph().compute()


def test_a_raising_kernel_is_an_error_row_naming_it():
    with kernel_replaced("relu", _raising(IndexError("index is out of bounds"))):
        r = check_sample(FAST, use_torch=False)
    assert r.status == "error"
    assert r.message.startswith("error: KernelError: IndexError in op relu's kernel "
                                "cpu_relu_raising")


@pytest.mark.parametrize("op, tier", [("relu", "all"), ("matmul", "fast")])
def test_an_isolated_run_gives_the_verdicts_of_an_in_process_one(op, tier):
    """The registry test runs our engine in its own process (a worker per op cost minutes
    of CI); this holds the isolated worker's rows, fast and scale tier, to those. matmul's
    fast tier only: its scale tier, two products of 1000 x 784 x 2000 among them, made this
    test 58 s of a cold run (the registry test runs it; the test above holds the scale
    cases of three other ops isolated, their paths and threads included)."""
    isolated = check_ops([op], tier=tier, isolate=True)
    local = check_ops([op], tier=tier, no_isolate=True)
    assert [(r.name, r.status, r.message) for r in isolated] == \
        [(r.name, r.status, r.message) for r in local]
