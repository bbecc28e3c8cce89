"""A user's adapter that raises anything (SystemExit, GeneratorExit, KeyboardInterrupt, a
BaseException of its own): at load, one usage line and exit 2; in a call, in-process or in
its worker process, an error row naming what it raised, the other cases still run, exit 1.
Only the user's real Ctrl-C (SIGINT to this process) interrupts (checkkit.raised).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gradcheck.cli import main
from tests.gradcheck.user_adapter import adapter_source, write_module

BAD = "x=[3,4]"            # the relu cases whose call raises: relu(type=f64,x=[3,4]), a view
RELU_F64_CASES = 11         # relu's f64 cases (samples and cotangent variants)

_names = itertools.count()


def adapter_module(tmp_path, monkeypatch, *, top="", isolated=False, init="pass",
                   describe="return 'mine 1.0'", unsupported="pass", vjp="pass",
                   extra="") -> str:
    """A user's adapter module in tmp_path, importable (here and in a worker); its engine
    name. The statements given run in each method; `bad(case)`: the case raises."""
    name = f"gv_raising_{os.getpid()}_{next(_names)}"
    body = adapter_source(bad=BAD, top=top, isolated=isolated, init=init, describe=describe,
                          unsupported=unsupported, vjp=vjp) + textwrap.dedent(extra)
    return write_module(tmp_path, monkeypatch, name, body)


def run_json(engine: str, tmp_path, capsys, ops=("relu",)) -> tuple[int, list[str], dict]:
    """gradcheck --engine ENGINE --op ... --dtype f64 with a JSON report: (status, stderr
    lines, rows by case)."""
    out = tmp_path / "r.json"
    argv = ["--engine", engine, "--dtype", "f64", "--no-torch", "--no-progress",
            "--format", "json", "--output", str(out)]
    for op in ops:
        argv += ["--op", op]
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    rows = {r["case"]: r for r in json.loads(out.read_text())["results"]} \
        if out.exists() else {}
    return code, err.splitlines(), rows


def assert_error_rows(rows: dict, message: str, total: int = RELU_F64_CASES) -> None:
    """The BAD cases are error rows with `message`; every other row passes."""
    assert len(rows) == total
    bad = {case: r for case, r in rows.items() if BAD in case}
    assert len(bad) == 2
    for r in bad.values():
        assert (r["status"], r["message"]) == ("error", message)
        assert r["repro"].startswith("gradcheck --engine ")
    assert {r["status"] for case, r in rows.items() if case not in bad} == {"pass"}


CALL_RAISES = [
    ("raise SystemExit(7)", "adapter raised SystemExit (sys.exit(7))"),
    ("raise SystemExit('bye')", "adapter raised SystemExit (sys.exit('bye'))"),
    ("raise SystemExit", "adapter raised SystemExit (sys.exit(None))"),
    ("raise GeneratorExit", "adapter raised GeneratorExit"),
    ("raise KeyboardInterrupt", "adapter raised KeyboardInterrupt"),
    ("raise Boom('engine gone')", "adapter raised Boom: engine gone"),
]


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("statement, message", CALL_RAISES,
                         ids=[s.split("raise ")[1] for s, _ in CALL_RAISES])
def test_what_vjp_raises_is_an_error_row_and_the_run_goes_on(statement, message, isolated,
                                                             tmp_path, monkeypatch, capsys):
    engine = adapter_module(tmp_path, monkeypatch, isolated=isolated,
                            vjp=f"if bad(case): {statement}")
    code, err, rows = run_json(engine, tmp_path, capsys)
    assert code == 1
    assert err == ["gradcheck: engine under test: mine 1.0",
                   f"gradcheck: wrote {tmp_path / 'r.json'} ({RELU_F64_CASES} results)"]
    assert_error_rows(rows, f"error: {message}")


def test_what_unsupported_raises_is_an_error_row(tmp_path, monkeypatch, capsys):
    engine = adapter_module(tmp_path, monkeypatch,
                            unsupported="if bad(case): raise SystemExit(3)")
    code, _, rows = run_json(engine, tmp_path, capsys)
    assert code == 1
    assert_error_rows(rows, "error: adapter raised SystemExit (sys.exit(3))")


def test_what_declined_raises_is_an_error_row(tmp_path, monkeypatch, capsys):
    engine = adapter_module(tmp_path, monkeypatch, extra="""
        def declined(self, case):
            if bad(case):
                raise Boom("no list")
            return {}
        A.declined = declined
        """)
    code, _, rows = run_json(engine, tmp_path, capsys)
    assert code == 1
    assert_error_rows(rows, "error: adapter raised Boom: no list")


def test_system_exit_in_forward_is_an_error_row(tmp_path, monkeypatch, capsys):
    """A dedicated backward op (clamp_back) runs through the adapter's `forward`."""
    engine = adapter_module(tmp_path, monkeypatch, extra="""
        def forward(self, case, arrays):
            raise SystemExit(5)
        A.forward = forward
        """)
    code, _, rows = run_json(engine, tmp_path, capsys, ops=("relu", "clamp_back"))
    assert code == 1
    back = [r for case, r in rows.items() if case.startswith("clamp_back")]
    assert back and all(r["status"] == "error" for r in back)
    assert {r["message"] for r in back} == {"error: adapter raised SystemExit (sys.exit(5))"}
    assert {r["status"] for case, r in rows.items() if case.startswith("relu")} == {"pass"}


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_what_a_forward_only_variant_raises_is_its_error_row(isolated, tmp_path, monkeypatch,
                                                             capsys):
    engine = adapter_module(tmp_path, monkeypatch, isolated=isolated, extra="""
        def forward_only_checks(self, case):
            if "x=[10]" in str(case):
                raise Boom("cannot list")
            return {"fast": None} if bad(case) else {}
        def forward_only_output(self, variant, case, arrays):
            raise SystemExit(9)
        A.forward_only_checks = forward_only_checks
        A.forward_only_output = forward_only_output
        """)
    code, _, rows = run_json(engine, tmp_path, capsys)
    assert code == 1
    variants = {case: r for case, r in rows.items() if "forward only]" in case}
    listing = [r for case, r in variants.items() if "[forward_only_checks:" in case]
    outputs = [r for case, r in variants.items() if "[fast:" in case]
    assert listing and {r["message"] for r in listing} == {
        "error: forward_only_checks() raised Boom: cannot list"}
    assert len(outputs) == 2 and {r["message"] for r in outputs} == {
        "error: adapter raised SystemExit (sys.exit(9))"}
    assert {r["status"] for case, r in rows.items() if case not in variants} == {"pass"}


LOAD_RAISES = [
    (dict(top="raise Boom('at import')"), "importing {module} raised Boom: at import"),
    (dict(top="raise KeyboardInterrupt"), "importing {module} raised KeyboardInterrupt"),
    (dict(top="raise GeneratorExit"), "importing {module} raised GeneratorExit"),
    (dict(init="raise Boom('no device')"), "cannot be set up: Boom: no device"),
    (dict(init="raise KeyboardInterrupt('ctor')"), "cannot be set up: KeyboardInterrupt: ctor"),
    (dict(init="raise SystemExit(4)"), "cannot be set up: SystemExit (sys.exit(4))"),
    (dict(describe="raise GeneratorExit"), "describe() raised GeneratorExit"),
    (dict(extra="""
        def __getattr__(name):
            raise Boom("lazy")
        """), None),
]


@pytest.mark.parametrize("given, words", LOAD_RAISES, ids=range(len(LOAD_RAISES)))
def test_what_an_adapter_raises_while_loading_is_one_usage_line(given, words, tmp_path,
                                                                monkeypatch, capsys):
    engine = adapter_module(tmp_path, monkeypatch, **given)
    module = engine.split(":")[0]
    if words is None:        # a module __getattr__ that raises, asked for an attribute it lacks
        engine, words = f"{module}:Missing", f"getting 'Missing' from {module} raised Boom: lazy"
    assert main(["--engine", engine, "--op", "relu", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gradcheck: engine '{engine}': {words.format(module=module)}\n"


def test_a_constructor_that_raises_only_in_the_worker_is_one_usage_line(tmp_path, monkeypatch,
                                                                       capsys):
    engine = adapter_module(tmp_path, monkeypatch, isolated=True, init=(
        "import multiprocessing\n"
        "        if multiprocessing.parent_process() is not None: raise Boom('only there')"))
    assert main(["--engine", engine, "--op", "relu", "--no-progress"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "gradcheck: engine under test: mine 1.0" and len(err) == 2
    assert "in the worker process" in err[1] and "Boom: only there" in err[1]


def test_a_generated_case_whose_unsupported_raises_is_an_error_row(tmp_path, monkeypatch):
    from gradcheck.adapters import get_adapter
    from gradcheck.generated import generated_results
    engine = adapter_module(tmp_path, monkeypatch, unsupported="raise SystemExit(6)")
    rows = generated_results("relu", 3, 0, "f64", use_torch=False, engine=get_adapter(engine),
                             shrink_checks=3)
    assert rows and {r.status for r in rows} == {"error"}
    assert {r.message.split("; ")[0] for r in rows} == {
        "error: adapter raised SystemExit (sys.exit(6))"}


# --- the user's Ctrl-C still interrupts -------------------------------------------------

python_handles_sigint = pytest.mark.skipif(
    not callable(signal.getsignal(signal.SIGINT)), reason="SIGINT is not Python's here")


@python_handles_sigint
def test_a_signal_watch_tells_a_real_sigint_from_a_raised_keyboard_interrupt():
    from checkkit.raised import SignalWatch
    before = signal.getsignal(signal.SIGINT)
    with SignalWatch() as watch:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            assert not watch.is_interruption(exc)
            watch.reraise(exc)                    # returns: the code's, not the user's
        with pytest.raises(KeyboardInterrupt) as caught:
            signal.raise_signal(signal.SIGINT)    # as Ctrl-C delivers it
            time.sleep(1)
        assert watch.is_interruption(caught.value)
        with pytest.raises(KeyboardInterrupt):
            watch.reraise(caught.value)
        assert not watch.is_interruption(RuntimeError("an Exception is always a row"))
    assert signal.getsignal(signal.SIGINT) is before


def test_signal_watches_nest_and_count_a_python_sigterm_handler():
    from checkkit.raised import SignalWatch

    class Terminated(KeyboardInterrupt):
        pass

    def terminate(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with SignalWatch() as outer:
            with SignalWatch() as inner:
                with pytest.raises(Terminated) as caught:
                    signal.raise_signal(signal.SIGTERM)
                    time.sleep(1)
                assert inner.is_interruption(caught.value)
            assert outer.signalled
            with SignalWatch() as later:
                assert not later.signalled
        assert signal.getsignal(signal.SIGTERM) is terminate
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_described_names_what_was_raised_on_one_line():
    from checkkit.raised import described

    class Odd(BaseException):
        def __str__(self):
            raise RuntimeError("no str")
    assert described(SystemExit(2)) == "SystemExit (sys.exit(2))"
    assert described(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert described(ValueError("two\nlines")) == "ValueError: two lines"
    assert described(Odd()) == "Odd: (its message cannot be shown)"


SLOW_VJP = """if bad(case):
            import os, time
            open(os.environ["GV_SLOW_FLAG"], "w").write(str(os.getpid()))
            time.sleep(60)"""


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_a_real_ctrl_c_still_interrupts_with_the_finished_rows(isolated, tmp_path,
                                                               monkeypatch):
    """SIGINT to the whole process group, as a terminal sends it, while the adapter (here,
    or in its worker process) runs a slow case: exit 130, one line, the rows finished so
    far written and marked interrupted; the worker process is gone."""
    engine = adapter_module(tmp_path, monkeypatch, isolated=isolated, vjp=SLOW_VJP)
    out, flag = tmp_path / "r.json", tmp_path / "slow.pid"
    argv = ["--engine", engine, "--op", "relu", "--dtype", "f64", "--no-torch",
            "--no-progress", "--format", "json", "--output", str(out)]
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        sys.argv = ["gradcheck", *{argv!r}]
        from gradcheck import console
        console.gradcheck()
        """)
    env = dict(os.environ, GV_SLOW_FLAG=str(flag))
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not flag.exists() or not flag.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.stderr.read()
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    assert status == 130, err
    done = json.loads(out.read_text())
    assert done["meta"]["interrupted"] is True and done["results"]
    assert err.splitlines()[-1] == (f"gradcheck: interrupted; wrote the "
                                    f"{len(done['results'])} row"
                                    f"{'s' * (len(done['results']) != 1)} finished so far "
                                    f"to {out}")
    assert "Traceback" not in err and len(err.splitlines()) == 2
    assert all(r["status"] == "pass" for r in done["results"])
    worker = int(flag.read_text())
    if isolated:
        assert worker != proc.pid
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:     # a zombie is gone too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False
