"""reports writes through engine.files (the one atomic writer; that it imports nothing else
of ours is a contract of pyproject.toml, tests/test_import_contracts.py); importing it loads
no engine; write errors are OutputError, one line, exit 2 from emit, the previous report
kept."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from reports import OutputError, Result, emit, write_atomic

HAS_DEV_FULL = os.path.exists("/dev/full")


def test_importing_reports_loads_no_engine():
    code = "import sys, reports; print(sorted(m for m in sys.modules if m == 'engine' " \
           "or m.startswith('engine.') or m == 'numba'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_a_full_device_is_an_output_error():
    with pytest.raises(OutputError) as info:
        write_atomic("/dev/full", "report\n")
    assert str(info.value) == "cannot write /dev/full: No space left on device"
    assert info.value.path == "/dev/full" and info.value.reason == "No space left on device"


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_emit_to_a_full_device_is_one_line_with_the_commands_name(capsys):
    results = [Result("mnist", "fc: accuracy", "pass", {})]
    assert emit(results, tool="mnist", fmt="json", output="/dev/full",
                prog="mnist-regress") == 2
    assert capsys.readouterr().err == \
        "mnist-regress: cannot write /dev/full: No space left on device\n"


def test_eio_while_syncing_keeps_the_previous_report(tmp_path, monkeypatch, capsys):
    report = tmp_path / "r.json"
    report.write_text("previous")

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    assert emit([Result("gradcheck", "relu", "pass", {})], tool="gradcheck", fmt="json",
                output=str(report)) == 2
    monkeypatch.undo()
    assert capsys.readouterr().err == f"gradcheck: cannot write {report}: Input/output error\n"
    assert report.read_text() == "previous" and os.listdir(tmp_path) == ["r.json"]


def test_a_directory_removed_before_the_write(tmp_path):
    gone = tmp_path / "gone"
    with pytest.raises(OutputError, match=rf"cannot write {gone}/r.txt: directory {gone} does "
                                          "not exist"):
        write_atomic(gone / "r.txt", "x")
