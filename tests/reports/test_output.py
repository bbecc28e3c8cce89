"""Where write_atomic writes and what it refuses: symlinks written through, FIFOs, devices
and the process's descriptors written into, special and read-only files refused, and the
pre-run checks (unwritable, first_unwritable) applying the same rules."""

from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reports import Result
from reports.output import OutputError, first_unwritable, render, unwritable, write_atomic

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX files and links")


def _refused(path, match):
    """write_atomic and unwritable both refuse `path`, with a message matching `match`."""
    with pytest.raises(OutputError, match=match) as exc:
        write_atomic(path, "new")
    assert exc.value.path == os.fspath(path) and "\n" not in str(exc.value)
    reason = unwritable(path)
    assert reason is not None and re.search(match, reason)


# --- symlinks -----------------------------------------------------------------------------
def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "report.json"
    target.write_text("old")
    target.chmod(0o640)
    first = tmp_path / "first"
    first.symlink_to("second")                        # a chain, relative links
    (tmp_path / "second").symlink_to("real/report.json")
    assert unwritable(first) is None
    write_atomic(first, "new")
    assert first.is_symlink() and (tmp_path / "second").is_symlink()
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(os.listdir(tmp_path / "real")) == ["report.json"]   # no temporary left
    assert sorted(os.listdir(tmp_path)) == ["first", "real", "second"]


def test_a_relative_link_is_read_from_the_links_own_directory(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    link = tmp_path / "a" / "out"
    link.symlink_to("../b/out.txt")
    write_atomic(link, "x")
    assert (tmp_path / "b" / "out.txt").read_text() == "x" and link.is_symlink()


def test_a_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "made.txt")
    assert unwritable(link) is None
    write_atomic(link, "made")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "made"


def test_a_link_into_a_missing_directory_names_that_directory(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone" / "r.txt")
    _refused(link, f"directory {tmp_path / 'gone'} does not exist")


@pytest.mark.parametrize("layout", ["self", "pair", "directory"])
def test_a_symlink_loop_says_so(tmp_path, layout):
    if layout == "self":
        path = tmp_path / "loop"
        path.symlink_to("loop")
    elif layout == "pair":
        path = tmp_path / "a"
        path.symlink_to("b")
        (tmp_path / "b").symlink_to("a")
    else:
        (tmp_path / "d").symlink_to("d")
        path = tmp_path / "d" / "r.txt"
    _refused(path, "symlink loop")
    assert "no such file" not in unwritable(path).lower()


# --- FIFOs, devices, descriptors, other special files --------------------------------------
def test_a_fifo_is_written_into_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert unwritable(fifo) is None                   # the check does not open (block on) it
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    writer = threading.Thread(target=write_atomic, args=(fifo, "through the pipe"),
                              daemon=True)
    writer.start()
    writer.join(5)
    reader.join(5)
    if reader.is_alive():                             # unblock it, then fail
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "w"):
            pass
    assert got == ["through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["fifo"]


def _device(tmp_path, kind, major, minor):
    path = tmp_path / f"dev{major}.{minor}"
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    return path


def test_a_character_device_is_written_into_not_replaced(tmp_path):
    null = _device(tmp_path, stat.S_IFCHR, 1, 3)      # a /dev/null of our own
    assert unwritable(null) is None
    write_atomic(null, "discarded")
    assert stat.S_ISCHR(os.lstat(null).st_mode) and len(os.listdir(tmp_path)) == 1


def test_a_block_device_is_refused(tmp_path):
    block = _device(tmp_path, stat.S_IFBLK, 7, 0)
    _refused(block, "not a regular file, FIFO or character device")
    assert stat.S_ISBLK(os.lstat(block).st_mode)


def test_a_socket_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # a short name: sun_path is small
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("sock")
        _refused(tmp_path / "sock", "not a regular file, FIFO or character device")
        assert stat.S_ISSOCK(os.lstat("sock").st_mode)


@pytest.mark.parametrize("spelling", ["/dev/fd/{fd}", "/proc/self/fd/{fd}",
                                      "/proc/{pid}/fd/{fd}"])
def test_a_descriptor_on_a_file_is_written_into_not_replaced(tmp_path, spelling):
    path = tmp_path / "behind.txt"
    path.write_text("")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        inode = path.stat().st_ino
        name = spelling.format(fd=fd, pid=os.getpid())
        assert unwritable(name) is None
        write_atomic(name, "one ")
        write_atomic(name, "two")
    finally:
        os.close(fd)
    assert path.read_text() == "one two" and path.stat().st_ino == inode
    assert os.listdir(tmp_path) == ["behind.txt"]


def test_a_descriptor_on_a_pipe_is_written_into(tmp_path):
    read_end, write_end = os.pipe()
    try:
        write_atomic(f"/dev/fd/{write_end}", "piped")
        assert os.read(read_end, 100) == b"piped"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_dev_stdout_redirected_to_a_file_is_written_into(capfd):
    print("before", flush=True)
    write_atomic("/dev/stdout", "report\n")
    assert capfd.readouterr().out == "before\nreport\n"


def test_a_closed_or_read_only_descriptor_is_refused(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("keep")
    fd = os.open(path, os.O_RDONLY)
    try:
        _refused(f"/dev/fd/{fd}", "open for reading only")
    finally:
        os.close(fd)
    _refused(f"/dev/fd/{fd}", f"descriptor {fd} is not open")
    _refused("/dev/fd/99999999999999999999", "is not open")
    assert path.read_text() == "keep"


# --- read-only files ------------------------------------------------------------------------
def test_a_read_only_report_is_refused_even_for_root(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("keep")
    path.chmod(0o444)
    _refused(path, r"it is read-only \(chmod u\+w to allow\)")
    link = tmp_path / "link"
    link.symlink_to("r.txt")
    _refused(link, "it is read-only")
    assert path.read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["link", "r.txt"]


@given(st.integers(0, 0o777))
def test_a_file_is_replaced_iff_writable_and_keeps_its_mode(mode):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "r.txt")
        with open(path, "w") as f:
            f.write("old")
        os.chmod(path, mode)
        writable = mode & 0o222 != 0 and os.access(path, os.W_OK)
        assert (unwritable(path) is None) == writable
        if writable:
            write_atomic(path, "new")
            assert stat.S_IMODE(os.stat(path).st_mode) == mode
        else:
            with pytest.raises(OutputError, match="read-only"):
                write_atomic(path, "new")
        os.chmod(path, 0o600)
        with open(path) as f:
            assert f.read() == ("new" if writable else "old")
        assert os.listdir(folder) == ["r.txt"]


# --- the pre-run checks -----------------------------------------------------------------
def test_an_empty_path_is_refused_not_skipped():
    assert unwritable("") == "an empty path"
    assert first_unwritable("") == "cannot write '': an empty path"
    assert first_unwritable(None, "", None) == "cannot write '': an empty path"
    with pytest.raises(OutputError, match="cannot write '': an empty path"):
        write_atomic("", "x")
    assert first_unwritable(None, None) is None


def test_first_unwritable_names_the_first_problem(tmp_path):
    good, bad = tmp_path / "a.txt", tmp_path / "no" / "b.txt"
    assert first_unwritable(good, None, tmp_path / "c.txt") is None
    assert first_unwritable(good, bad) == \
        f"cannot write {bad}: directory {tmp_path / 'no'} does not exist"


def test_two_outputs_naming_one_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert first_unwritable("m.gguf", "m.gguf") == "m.gguf is given as two outputs"
    assert first_unwritable("m.gguf", str(tmp_path / "m.gguf")).startswith(
        f"{tmp_path / 'm.gguf'} is given as two outputs")        # not yet there: by path
    (tmp_path / "link").symlink_to("m.gguf")
    assert "is given as two outputs" in first_unwritable("m.gguf", "link")
    (tmp_path / "m.gguf").write_text("model")
    os.link("m.gguf", "hard")                                   # existing: samefile
    assert first_unwritable("hard", "link") == "link is given as two outputs (also as hard)"
    assert first_unwritable("m.gguf", "graph.json") is None


def test_a_character_device_may_be_given_twice():
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode):
        pytest.skip("no /dev/null here")
    assert first_unwritable("/dev/null", "/dev/null") is None   # only checked, not written


def test_odd_names_are_one_line_output_errors(tmp_path):
    with pytest.raises(OutputError, match="not a usable file name") as exc:
        write_atomic(tmp_path / "a\0b", "x")
    assert "\0" not in str(exc.value)
    message = first_unwritable(str(tmp_path / "no\ndir" / "r.txt"))
    assert message.startswith("cannot write '") and "\n" not in message


_NAMES = st.text(st.sampled_from("ab./\0\n\udcff\ud800ü-"), max_size=8)


@given(_NAMES, _NAMES)
def test_any_name_is_written_or_refused_with_an_output_error(first, second):
    with tempfile.TemporaryDirectory() as folder:
        os.mkdir(os.path.join(folder, "d"))
        os.symlink("d", os.path.join(folder, "l"))
        path = os.path.join(folder, first)
        reason = unwritable(path)
        pair = first_unwritable(path, os.path.join(folder, second))
        assert pair is None or "\n" not in pair
        try:
            write_atomic(path, "x")
        except OutputError as exc:
            assert reason is not None and "\n" not in str(exc)
        else:
            assert reason is None


@pytest.mark.parametrize("fmt", ["plain", "github"])
def test_an_interrupted_runs_text_report_says_it_is_incomplete(fmt):
    rows = [Result("gradcheck", "relu(x)", "pass")]
    stopped = render(rows, fmt, "gradcheck", {"interrupted": True, "signal": "SIGTERM"},
                     verbose=True)
    assert stopped.endswith("interrupted by SIGTERM: these are the rows finished before it; "
                            "the run is incomplete\n")
    assert "incomplete" not in render(rows, fmt, "gradcheck", {"argv": []}, verbose=True)
