"""The pytest plugin (gradcheck.pytest_plugin) and the user helpers (gradcheck.pytest).

Each test runs pytest (or a CLI) in a subprocess, in a directory of its own, as a user
would: the plugin is the installed entry point, and no test file is needed for the items.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from checkkit.sweep import item_name
from gradcheck.runner import checkable_ops, select_samples

STRIPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                "PYTEST_XDIST_TESTRUNUID", "PYTEST_DISABLE_PLUGIN_AUTOLOAD")
# a small sweep, as plugin options and as CLI options
SMALL = ["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-op", "softmax",
         "--gradcheck-dtype", "f64", "--gradcheck-no-torch"]
SMALL_CLI = ["--op", "relu", "--op", "softmax", "--dtype", "f64", "--no-torch", "--no-progress"]


def _run(args, cwd, module="pytest", timeout=240, **env_vars) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV} | env_vars
    base = [sys.executable, "-m", module] + (["-p", "no:cacheprovider"] if module == "pytest"
                                              else [])
    return subprocess.run(base + list(args), cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _ids(stdout: str, tool: str = "gradcheck") -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(f"{tool}::")]


def _doc(path) -> dict:
    """A results document without what differs between runs: time, argv, seconds."""
    doc = json.loads(path.read_text())
    del doc["meta"]["time"], doc["meta"]["argv"]
    for row in doc["results"]:
        row.pop("seconds", None)
    return doc


def _verdicts(doc) -> list[tuple[str, str]]:
    return [(row["case"], row["status"]) for row in doc["results"]]


# --- collection ---------------------------------------------------------------------------
def test_the_plugin_collects_exactly_the_cases_of_gradcheck_all(tmp_path):
    proc = _run(["--gradcheck", "--collect-only", "-q"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = [f"gradcheck::{item_name(str(s))}" for s in select_samples(checkable_ops())]
    assert _ids(proc.stdout) == expected


def test_ids_name_the_backend_only_when_there_are_several(tmp_path):
    one = _run(["--gradcheck", "--gradcheck-op", "relu", "--collect-only", "-q"], tmp_path)
    two = _run(["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-backend", "cpu",
                "--gradcheck-backend", "cuda", "--gradcheck-random", "3", "--collect-only",
                "-q"], tmp_path, NUMBA_ENABLE_CUDASIM="1")
    assert two.returncode == 0, two.stdout + two.stderr
    cases = [str(s) for s in select_samples(["relu"])]
    assert _ids(one.stdout) == [f"gradcheck::relu[{c}]" for c in cases]
    assert _ids(two.stdout) == [f"gradcheck::relu[{c}[{b}]]" for c in cases
                                for b in ("cpu", "cuda")] + \
        ["gradcheck::relu[relu(generated)[cpu]]", "gradcheck::relu[relu(generated)[cuda]]"]


def test_an_item_is_named_so_that_pytest_reads_its_id_back_whole():
    """pytest 9.2 takes an id's parameters from its first "[" to a "]" ending it: a case
    string with brackets goes inside OP[...], whole; one without stays as it is."""
    from _pytest.nodeid import NodeId
    for case in ("relu(type=f64,x=[10])", "relu(type=f16,x=[4,4]slice[1:5,0:8:2])",
                 "relu(type=f64,x=[3,4],cotangent=permuted)[cuda]",
                 "pool_2d(type=f32,x=[1,2,6,6],k=[2,2])"):
        name = item_name(case)
        op = case.split("(")[0]
        assert name == f"{op}[{case}]"
        parsed = NodeId.parse(f"gradcheck::{name}")
        assert parsed.rest == name and parsed.params == case
    for plain in ("relu(generated)", "adam: torch(type=f32)"):
        assert item_name(plain) == plain


def test_under_xdist_a_failing_items_id_has_no_stray_bracket(tmp_path):
    proc = _run(["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-inject", "scale",
                 "--gradcheck-filter", "type=f64,x=[10]", "--gradcheck-no-torch", "-n", "2",
                 "-rf"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ids = [line.split(" - ")[0].removeprefix("FAILED ")
           for line in proc.stdout.splitlines() if line.startswith("FAILED ")]
    cases = [str(c) for c in select_samples(["relu"]) if "type=f64,x=[10]" in str(c)]
    assert ids and sorted(ids) == sorted(f"gradcheck::relu[{c}]" for c in cases), ids


def test_optcheck_items_are_its_family_runs(tmp_path):
    proc = _run(["--optcheck", "--optcheck-opt", "adam", "--optcheck-dtype", "f64",
                 "--collect-only", "-q"], tmp_path)
    assert _ids(proc.stdout, "optcheck") == [
        f"optcheck::adam: {f}(type=f64)" for f in ("closed-form", "torch", "invariant",
                                                   "precision", "reference", "known-bugs")]


def test_without_its_option_the_plugin_adds_nothing_and_loads_nothing_of_ours(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    proc = _run(["--collect-only", "-q"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_one.py::test_one" in proc.stdout and "gradcheck::" not in proc.stdout


def test_pytest_start_up_imports_no_engine(tmp_path):
    (tmp_path / "test_modules.py").write_text(textwrap.dedent("""
        import sys

        def test_nothing_heavy():
            assert not {"engine", "numba", "torch"} & set(sys.modules)
    """))
    proc = _run(["-q"], tmp_path)
    assert proc.returncode == 0, proc.stdout


# --- running -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def serial_doc(tmp_path_factory):
    """The document of the small sweep from the serial CLI (`gradcheck --format json`)."""
    where = tmp_path_factory.mktemp("serial")
    proc = _run([*SMALL_CLI, "--format", "json", "--output", str(where / "cli.json")], where,
                module="gradcheck.cli")
    assert proc.returncode == 0, proc.stderr
    doc = _doc(where / "cli.json")
    assert len(doc["results"]) > 10
    return doc


def test_two_processes_write_the_serial_clis_document(tmp_path, serial_doc):
    out = tmp_path / "n2.json"
    proc = _run([*SMALL, "-n", "2", f"--gradcheck-json={out}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"gradcheck: wrote {out} ({len(serial_doc['results'])} results)" in proc.stdout
    assert _doc(out) == serial_doc


def test_the_serial_plugin_writes_the_same_document(tmp_path, serial_doc):
    out = tmp_path / "serial.json"
    proc = _run([*SMALL, f"--gradcheck-json={out}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _doc(out) == serial_doc


def test_two_hosts_with_their_own_working_directories(tmp_path, serial_doc):
    """The recipe for real hosts (`--tx ssh=...`), on this machine: two popen gateways,
    each worker in a directory of its own."""
    hosts = [tmp_path / "host1", tmp_path / "host2"]
    for host in hosts:
        host.mkdir()
    out = tmp_path / "hosts.json"     # a new file: xdist refuses an existing path argument
    tx = [arg for host in hosts for arg in ("--tx", f"popen//chdir={host}")]
    proc = _run([*SMALL, *tx, "--dist", "load", "-v", f"--gradcheck-json={out}"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[gw0]" in proc.stdout and "[gw1]" in proc.stdout
    assert all(any(host.iterdir()) for host in hosts)     # xdist worked in each directory
    assert _verdicts(_doc(out)) == _verdicts(serial_doc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _socket_server(where) -> tuple[subprocess.Popen, int]:
    """execnet's socket server (what a host runs for `--tx socket=HOST:PORT`) in `where`,
    once it accepts connections."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "execnet.script.socketserver",
                               f"127.0.0.1:{port}"], cwd=where, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            return server, port
        time.sleep(0.1)
    server.kill()
    raise AssertionError("the socket server did not start")


@pytest.mark.slow
def test_two_hosts_through_socket_gateways(tmp_path, serial_doc):
    """docs/guides/distributed.md's `--tx socket=HOST:PORT` recipe, two servers on this machine."""
    servers = []
    try:
        for name in ("host1", "host2"):
            (tmp_path / name).mkdir()
            servers.append(_socket_server(tmp_path / name))
        out = tmp_path / "hosts.json"
        tx = [a for _, port in servers for a in ("--tx", f"socket=127.0.0.1:{port}")]
        proc = _run([*SMALL, "-d", *tx, "-v", f"--gradcheck-json={out}"], tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[gw0]" in proc.stdout and "[gw1]" in proc.stdout
        assert _verdicts(_doc(out)) == _verdicts(serial_doc)
    finally:
        for server, _ in servers:
            server.kill()
            server.wait()


DYING_OP = """
import os

from engine.registry import OpDef, register, registered
from engine.samples import InputSpec, Sample

BUILT = [0]


def square_then_die(x):
    BUILT[0] += 1        # built once when collected, then again when checked: die then
    if BUILT[0] > 1 and os.environ.get("PYTEST_XDIST_WORKER"):
        os._exit(3)
    return registered.mul(x, x)


register(OpDef("user_dies", kind="composite", compose=square_then_die,
               samples=lambda: [Sample.make("user_dies", [InputSpec("x", (3,))], "f64")]))
"""


def test_a_worker_that_dies_leaves_a_crash_row(tmp_path):
    (tmp_path / "conftest.py").write_text(DYING_OP)
    out = tmp_path / "crash.json"
    proc = _run(["--gradcheck", "--gradcheck-op", "user_dies", "--gradcheck-op", "relu",
                 "--gradcheck-dtype", "f64", "--gradcheck-no-torch", "-n", "2",
                 f"--gradcheck-json={out}"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = _doc(out)["results"]
    assert rows[0]["case"] == "user_dies(type=f64,x=[3])" and rows[0]["status"] == "crash"
    assert "crashed while running" in rows[0]["message"]
    assert {r["status"] for r in rows[1:]} == {"pass"} and len(rows) > 5


def test_a_failing_item_reports_the_rows_message_and_repro(tmp_path):
    junit = tmp_path / "junit.xml"
    proc = _run(["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-inject", "scale",
                 "--gradcheck-filter", "type=f64,x=[10]", "--gradcheck-no-torch",
                 f"--junitxml={junit}"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "relu(type=f64,x=[10]): fail: " in proc.stdout
    assert "reproduce: gradcheck --inject scale --op relu -k 'relu(type=f64,x=[10])'" \
        in proc.stdout
    xml = junit.read_text()
    assert 'classname="gradcheck" name="relu[relu(type=f64,x=[10])]"' in xml
    assert '<property name="repro" value="gradcheck --inject scale --op relu' in xml


def test_rows_without_a_gradient_are_skips_with_their_message(tmp_path):
    proc = _run(["--gradcheck", "--gradcheck-op", "argmax", "--gradcheck-dtype", "f64",
                 "-rs"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skip: no gradient: integer output" in proc.stdout and "3 skipped" in proc.stdout


def test_the_cli_workers_option_gives_the_serial_report(tmp_path, serial_doc):
    out = tmp_path / "w.json"
    proc = _run([*SMALL_CLI, "--workers", "2", "--format", "json", "--output", str(out)],
                tmp_path, module="gradcheck.cli")
    assert proc.returncode == 0, proc.stderr
    assert _doc(out) == serial_doc


def test_optcheck_items_give_the_cli_document(tmp_path):
    args = ["--opt", "sgd", "--family", "closed-form", "--dtype", "f64", "--steps", "5",
            "--no-progress", "--format", "json"]
    serial = _run([*args, "--output", str(tmp_path / "s.json")], tmp_path,
                  module="optcheck.cli")
    workers = _run([*args, "--workers", "2", "--output", str(tmp_path / "w.json")],
                   tmp_path, module="optcheck.cli")
    assert serial.returncode == workers.returncode == 0, workers.stderr
    assert _doc(tmp_path / "w.json") == _doc(tmp_path / "s.json")


# --- usage errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--gradcheck", "--gradcheck-dtype", "f8"],
     "--gradcheck-dtype must be one of f16, bf16, f32, f64, all, got 'f8'"),
    (["--gradcheck", "--gradcheck-op", "no_such_op"], "no_such_op"),
    (["--gradcheck", "--gradcheck-random", "-1"],
     "--gradcheck-random must be a number of cases per op in [0, 10000]"),
    (["--gradcheck", "--gradcheck-random", "10001"], "got 10001"),
    (["--gradcheck", "--gradcheck-engine", "torch", "--gradcheck-backend", "cpu"],
     "--gradcheck-backend applies to our engine only"),
    (["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-filter", "nothing"],
     "no sample case of relu matches"),
    (["--gradcheck-op", "relu"], "--gradcheck-op applies to --gradcheck, which is not given"),
    (["--optcheck", "--optcheck-opt", "lion"], "--optcheck-opt must be one of"),
    (["--optcheck", "--optcheck-steps", "0"], "--optcheck-steps must lie in [1, 10000]"),
    (["--optcheck", "--optcheck-steps", "100000000"], "got 100000000"),
    (["--gradcheck", "--gradcheck-json=no/such/dir/out.json"], "--gradcheck-json: cannot write"),
])
def test_bad_options_are_usage_errors(tmp_path, args, message):
    proc = _run([*args, "--collect-only"], tmp_path)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize("module, args", [("gradcheck.cli", ["--op", "relu"]),
                                          ("optcheck.cli", ["--opt", "sgd"])])
def test_cli_workers_out_of_range_is_a_one_line_usage_error(tmp_path, module, args):
    proc = _run([*args, "--workers", "0"], tmp_path, module=module)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith("--workers must lie in [1, 256], got 0")


# --- your own suite --------------------------------------------------------------------------
USER_SUITE = '''
import numpy as np
import pytest

from engine.registry import OpDef, register, registered
from engine.samples import InputSpec, Sample
from gradcheck.pytest import assert_gradcheck, cases, function_case


def softsign_ish(x):
    """x * sigmoid(x), a composite op of the user's"""
    return registered.mul(x, registered.sigmoid(x))


def _samples():
    return [Sample.make("user_swish", [InputSpec("x", (3, 4))], "f64"),
            Sample.make("user_swish", [InputSpec("x", (2, 5))], "f64")]


register(OpDef("user_swish", kind="composite", compose=softsign_ish, samples=_samples))
X = np.random.default_rng(0).normal(size=(3, 4))


@pytest.mark.parametrize("case", cases("user_swish"))
def test_user_op(case):
    assert_gradcheck(case, use_torch=False)


@pytest.mark.parametrize("case", cases("user_swish", pattern="x=[3,4]"))
def test_user_op_with_a_bug(case):
    assert_gradcheck(case, inject="scale:1.5", use_torch=False)


@pytest.mark.parametrize("case", cases([function_case(softsign_ish, [X], name="swish")]))
def test_user_function(case):
    assert_gradcheck(case, use_torch=False)
'''


def test_a_users_suite_gets_the_same_items_and_failure_text(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_SUITE)
    proc = _run(["-v", "test_user.py"], tmp_path)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    for passing in ("test_user_op[user_swish(type=f64,x=[3,4])] PASSED",
                    "test_user_op[user_swish(type=f64,x=[2,5])] PASSED",
                    "test_user_function[swish(x=[3,4])] PASSED",
                    "test_user_op_with_a_bug[user_swish(type=f64,x=[3,4])] FAILED"):
        assert passing in out
    assert "user_swish(type=f64,x=[3,4]): fail: " in out
    assert "reproduce: gradcheck --inject scale:1.5 --op user_swish -k " in out


def test_gradcheck_pytest_gets_the_real_pytest():
    import gradcheck.pytest as helpers
    assert helpers.pytest is pytest and helpers.pytest.__name__ == "pytest"
