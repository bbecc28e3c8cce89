"""engine.files, the one atomic writer: what it writes where, and every way a write can fail
(the previous file byte for byte as it was, no temporary file left, one WriteError line
naming the path). This machine may run the tests as root, where permissions cannot fail a
write; the failures are then made otherwise: a directory in place of the file, a path under
a regular file, a directory removed mid-write, /dev/full, os.fsync or os.replace raising
EIO."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading

import pytest

from engine.errors import EngineError
from engine.files import (
    WriteError,
    atomic_write,
    first_unwritable,
    resolve,
    unwritable,
    write_atomic,
)

HAS_DEV_FULL = os.path.exists("/dev/full")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.fixture
def old(tmp_path):
    """An existing file the failing writes must leave exactly as it is."""
    path = tmp_path / "out.bin"
    path.write_bytes(b"the previous contents\n")
    return path


def _intact(path, directory=None) -> None:
    assert path.read_bytes() == b"the previous contents\n"
    assert os.listdir(directory or path.parent) == [path.name]


# --- what is written where -----------------------------------------------------------------

def test_a_new_file_gets_the_mode_any_new_file_gets(tmp_path):
    write_atomic(tmp_path / "new.txt", "héllo\n")
    assert (tmp_path / "new.txt").read_text(encoding="utf-8") == "héllo\n"
    assert stat.S_IMODE(os.stat(tmp_path / "new.txt").st_mode) == 0o666 & ~_umask()
    assert os.listdir(tmp_path) == ["new.txt"]


def test_a_replaced_file_keeps_its_mode_and_the_writes_add_up(old):
    old.chmod(0o640)
    with atomic_write(old) as f:
        f.write(b"one ")
        f.write(memoryview(b"two"))
    assert old.read_bytes() == b"one two"
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o640
    assert os.listdir(old.parent) == [old.name]


def test_readers_see_the_old_file_until_the_block_ends(old):
    with atomic_write(old) as f:
        f.write(b"new")
        f.flush()
        assert old.read_bytes() == b"the previous contents\n"
        (temp,) = set(os.listdir(old.parent)) - {old.name}
        assert temp.startswith(".out.bin.") and temp.endswith(".tmp")
    assert old.read_bytes() == b"new"


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path, old):
    link = tmp_path / "link"
    link.symlink_to(old.name)
    write_atomic(link, b"x")
    assert link.is_symlink() and old.read_bytes() == b"x"


def test_a_long_name_leaves_room_for_the_temporary_suffix(tmp_path):
    path = tmp_path / ("n" * 250)
    write_atomic(path, b"x")
    assert path.read_bytes() == b"x" and os.listdir(tmp_path) == [path.name]


def test_dev_null_and_a_fifo_are_written_straight_into(tmp_path):
    assert resolve("/dev/null")[1] == "straight"
    write_atomic("/dev/null", b"nothing")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, b"through the pipe")
    reader.join(5)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert os.listdir(tmp_path) == ["fifo"]


def test_our_own_descriptor_is_written_through_a_duplicate():
    read_end, write_end = os.pipe()
    try:
        write_atomic(f"/dev/fd/{write_end}", b"to the pipe")
        os.close(write_end)
        assert os.read(read_end, 100) == b"to the pipe"
    finally:
        for fd in (read_end, write_end):
            try:
                os.close(fd)
            except OSError:
                pass


# --- failures ------------------------------------------------------------------------------

def test_write_error_is_an_engine_error_and_an_os_error_in_one_line(tmp_path):
    with pytest.raises(WriteError) as info:
        write_atomic(tmp_path / "a\nb" / "c", b"x")
    error = info.value
    assert isinstance(error, EngineError) and isinstance(error, OSError)
    assert "\n" not in str(error) and str(error).startswith("cannot write '")
    assert error.path == str(tmp_path / "a\nb" / "c") and error.errno == errno.ENOENT


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
def test_a_full_device_fails_at_write_time_in_one_line():
    assert unwritable("/dev/full") is None          # nothing tells before the write
    with pytest.raises(WriteError) as info:
        write_atomic("/dev/full", b"x" * 100)
    assert str(info.value) == "cannot write /dev/full: No space left on device"
    assert info.value.errno == errno.ENOSPC


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_eio_keeps_the_previous_file_and_removes_the_temporary(old, monkeypatch, failing):
    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, eio)
    with pytest.raises(WriteError, match=r"out.bin: Input/output error$") as info:
        write_atomic(old, b"new contents")
    monkeypatch.undo()
    assert info.value.errno == errno.EIO
    _intact(old)


def test_an_os_error_inside_the_block_is_a_write_error(old):
    with pytest.raises(WriteError, match=r"out.bin: No space left on device"):
        with atomic_write(old) as f:
            f.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    _intact(old)


@pytest.mark.parametrize("exc", [ValueError("bad value"), KeyboardInterrupt()])
def test_any_other_exception_passes_through_after_the_clean_up(old, exc):
    with pytest.raises(type(exc)):
        with atomic_write(old) as f:
            f.write(b"half")
            raise exc
    _intact(old)


def test_a_directory_removed_mid_write(tmp_path):
    where = tmp_path / "runs"
    where.mkdir()
    with pytest.raises(WriteError, match=rf"runs/m: directory {where} does not exist$"):
        with atomic_write(where / "m") as f:
            f.write(b"data")
            shutil.rmtree(where)
    assert os.listdir(tmp_path) == []


def test_a_directory_that_is_gone_before_the_write(tmp_path):
    with pytest.raises(WriteError, match=rf"directory {tmp_path / 'gone'} does not exist$"):
        write_atomic(tmp_path / "gone" / "m", b"x")
    assert os.listdir(tmp_path) == []


def test_a_directory_in_place_of_the_file(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(WriteError, match=r"/d: it is a directory$"):
        write_atomic(tmp_path / "d", b"x")
    assert os.listdir(tmp_path / "d") == []


def test_a_directory_that_takes_the_files_place_mid_write(tmp_path):
    target = tmp_path / "m"
    with pytest.raises(WriteError, match=r"/m: Is a directory$"):
        with atomic_write(target) as f:
            f.write(b"data")
            target.mkdir()
    assert os.listdir(tmp_path) == ["m"] and os.listdir(target) == []


def test_a_path_under_a_regular_file(old):
    with pytest.raises(WriteError, match=rf"{old} is not a directory$"):
        write_atomic(old / "inside", b"x")
    _intact(old)


def test_a_read_only_file_is_refused_even_as_root(old):
    old.chmod(0o444)
    with pytest.raises(WriteError, match=r"out.bin: it is read-only \(chmod u\+w to allow\)"):
        write_atomic(old, b"x")
    _intact(old)


@pytest.mark.skipif(ROOT or os.name != "posix", reason="root writes any directory")
def test_a_directory_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(WriteError, match=r"is not writable"):
            write_atomic(locked / "m", b"x")
    finally:
        locked.chmod(0o700)


def test_the_temporary_file_refused_by_the_system(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if flags & os.O_EXCL:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(WriteError, match=r"/m: Disk quota exceeded$"):
        write_atomic(tmp_path / "m", b"x")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_text_that_is_not_utf8_is_refused_before_anything_is_written(old):
    with pytest.raises(WriteError, match=r"text is not valid UTF-8"):
        write_atomic(old, "\udcff")
    _intact(old)


@pytest.mark.parametrize("path, reason", [
    ("", "an empty path"),
    ("a\0b", "not a usable file name"),
])
def test_names_that_are_no_file(path, reason):
    assert reason in unwritable(path)
    with pytest.raises(WriteError, match=reason):
        write_atomic(path, b"x")


def test_first_unwritable_says_which_and_why_and_finds_one_file_twice(tmp_path):
    (tmp_path / "link").symlink_to("a.json")
    assert first_unwritable(None, tmp_path / "a.json") is None
    assert first_unwritable(tmp_path / "a.json", tmp_path / "link") == \
        f"{tmp_path / 'link'} is given as two outputs (also as {tmp_path / 'a.json'})"
    assert first_unwritable("/dev/null", "/dev/null") is None
    assert first_unwritable(tmp_path, "x") == f"cannot write {tmp_path}: it is a directory"
