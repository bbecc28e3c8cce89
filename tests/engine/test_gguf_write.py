"""Writing GGUF: atomic writes that leave an existing file whole on any failure, clear
errors for what GGUF cannot hold, and writing through links and into streams, never over
read-only files."""

from __future__ import annotations

import contextlib
import os
import stat
import threading

import numpy as np
import pytest

from engine import gguf_io
from engine.errors import EngineError
from engine.files import WriteError
from engine.gguf_io import GGUFFormatError, load_gguf, save_gguf
from tests.engine.gguf_samples import (
    small_file,
)

# --- atomic writes ---------------------------------------------------------------------------

def test_unsupported_dtype_midway_leaves_existing_file_and_no_temp_files(tmp_path):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()
    arrays = {"first": np.ones(3, np.float32), "bad.half": np.ones(3, np.int16),
              "last": np.ones(3, np.float32)}
    with pytest.raises(GGUFFormatError, match=r"tensor 'bad.half': unsupported dtype int16"):
        save_gguf(path, arrays, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


def test_failure_while_writing_leaves_existing_file_and_no_temp_files(tmp_path, monkeypatch):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()

    def fail_midway(out, arrays, alignment):
        out.write(b"partial tensor data")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_io, "_write_tensor_data", fail_midway)
    with pytest.raises(WriteError, match=r"cannot write .*model.gguf: disk full"):
        save_gguf(path, {"x": np.ones(4, np.float32)}, "test-arch")
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_full_device_is_a_write_error_naming_it():
    with pytest.raises(WriteError, match=r"^cannot write /dev/full: No space left on device$"):
        save_gguf("/dev/full", {"x": np.ones(4, np.float32)}, "test-arch")


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_io_error_at_sync_or_rename_keeps_the_old_file(tmp_path, monkeypatch, failing):
    import errno
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, failing, eio)
    with pytest.raises(WriteError, match=r"model.gguf: Input/output error") as info:
        save_gguf(path, {"x": np.ones(4, np.float32)}, "test-arch")
    assert info.value.errno == errno.EIO and isinstance(info.value, (OSError, EngineError))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]


def test_directory_that_vanishes_before_the_write_is_a_write_error(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    gone.rmdir()
    with pytest.raises(WriteError, match=r"gone/m.gguf: directory .*gone does not exist"):
        save_gguf(gone / "m.gguf", {"x": np.ones(4, np.float32)}, "test-arch")
    with pytest.raises(WriteError, match=r"is not a directory"):
        save_gguf(small_file(tmp_path / "f.gguf") / "m.gguf", {"x": np.ones(1)}, "arch")
    assert os.listdir(tmp_path) == ["f.gguf"]


def test_save_replaces_existing_file_with_umask_permissions(tmp_path):
    path = small_file(tmp_path / "model.gguf")
    save_gguf(path, {"y": np.ones(2, np.float64)}, "other")
    assert list(load_gguf(path, arch="other").tensors) == ["y"]
    assert sorted(os.listdir(tmp_path)) == ["model.gguf"]
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


# --- errors on saving ------------------------------------------------------------------------

@pytest.mark.parametrize("tensors, match", [
    ({"x": np.ones(3, np.int64)}, r"tensor 'x': unsupported dtype int64"),
    ({"x": np.ones(3, bool)}, r"tensor 'x': unsupported dtype bool"),
    ({"x": np.array([None])}, r"tensor 'x': unsupported dtype object"),
    ({"x": np.float32(1.0)}, r"tensor 'x': expected a numpy array, got float32"),
    ({"x": np.array(1.0, np.float32)}, r"tensor 'x': 0-d arrays are not stored; reshape it"),
    ({"x": np.ones((1,) * 5, np.float32)}, r"tensor 'x': shape \[1, 1, 1, 1, 1\] has 5 dim"),
    ({"x" * 64: np.ones(1, np.float32)}, r"name is 64 bytes; ggml allows at most 63"),
    ({"": np.ones(1, np.float32)}, r"tensor names must be non-empty strings"),
    ({"x": [1.0, 2.0]}, r"tensor 'x': expected a numpy array, got list"),
])
def test_tensors_gguf_cannot_hold_are_refused(tmp_path, tensors, match):
    with pytest.raises(GGUFFormatError, match=match):
        save_gguf(tmp_path / "t.gguf", tensors, "arch")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("metadata, match", [
    ({"k": []}, r"metadata 'k': an empty list cannot be stored"),
    ({"k": [1, 2.0]}, r"metadata 'k': list mixes element types \['FLOAT64', 'INT64'\]"),
    ({"k": [True, 1]}, r"metadata 'k': list mixes element types"),
    ({"k": [[1]]}, r"metadata 'k': unsupported value \[1\] of type list"),
    ({"k": None}, r"metadata 'k': unsupported value None of type NoneType"),
    ({"k": {"a": 1}}, r"metadata 'k': unsupported value .* of type dict"),
    ({"k": 2**63}, r"metadata 'k': int 9223372036854775808 does not fit in INT64"),
    ({"k": "\ud800"}, r"metadata 'k': string is not encodable as UTF-8"),
    ({"general.architecture": "x"}, r"metadata key 'general.architecture' is reserved"),
    ({"general.alignment": 64}, r"metadata key 'general.alignment' is reserved"),
    ({"GGUF.version": 3}, r"metadata key 'GGUF.version' is reserved"),
    ({3: "x"}, r"metadata keys must be non-empty strings, got 3"),
])
def test_metadata_gguf_cannot_hold_is_refused(tmp_path, metadata, match):
    with pytest.raises(GGUFFormatError, match=match):
        save_gguf(tmp_path / "t.gguf", {}, "arch", metadata)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("arch", ["", None, 3])
def test_bad_arch_is_refused(tmp_path, arch):
    with pytest.raises(GGUFFormatError, match="arch must be a non-empty string"):
        save_gguf(tmp_path / "t.gguf", {}, arch)


# --- writing through links, into streams, never over read-only files -------------------------

def test_symlink_output_stays_a_link_and_its_target_is_replaced(tmp_path):
    real = small_file(tmp_path / "real.gguf")
    (tmp_path / "link.gguf").symlink_to("real.gguf")
    save_gguf(tmp_path / "link.gguf", {"y": np.ones(2, np.float64)}, "other")
    assert (tmp_path / "link.gguf").is_symlink()
    assert list(load_gguf(real, arch="other").tensors) == ["y"]
    assert sorted(os.listdir(tmp_path)) == ["link.gguf", "real.gguf"]


def test_dangling_symlink_output_creates_its_target(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.gguf").symlink_to(tmp_path / "sub" / "new.gguf")
    save_gguf(tmp_path / "link.gguf", {"y": np.ones(2, np.float64)}, "other")
    assert (tmp_path / "link.gguf").is_symlink()
    assert sorted(os.listdir(tmp_path / "sub")) == ["new.gguf"]


def test_pipe_and_fifo_outputs_are_written_straight_into(tmp_path):
    small_file(tmp_path / "plain.gguf")
    expected = (tmp_path / "plain.gguf").read_bytes()
    read_end, write_end = os.pipe()
    try:
        small_file(f"/dev/fd/{write_end}")   # a pipe: no tell(), no seek, nothing to replace
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            assert reader.read() == expected
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)
    os.mkfifo(tmp_path / "fifo")
    got = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "fifo").read_bytes()))
    reader.start()
    small_file(tmp_path / "fifo")
    reader.join(5)
    assert got == [expected] and stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "plain.gguf"]


def device_node(path, mode, major, minor):
    """A device node of its own at `path` (mode: its type and permissions), or a skip where
    this process may not create one."""
    try:
        os.mknod(path, mode, os.makedev(major, minor))
    except OSError as exc:
        pytest.skip(f"cannot create a device node here: {exc}")
    return path


def test_character_device_output_is_written_straight_into(tmp_path):
    # a node of its own for the null device: a regression must not replace the real /dev/null
    device = device_node(tmp_path / "null", stat.S_IFCHR | 0o666, 1, 3)
    save_gguf(device, {"x": np.ones(3, np.float32)}, "arch")
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert os.listdir(tmp_path) == ["null"]


def test_block_device_output_is_refused_before_it_is_opened(tmp_path):
    # a node of its own (a loop device's numbers): never opened, since it is refused first
    device = device_node(tmp_path / "disk", stat.S_IFBLK | 0o600, 7, 0)
    with pytest.raises(WriteError, match="not a regular file, FIFO or character device"):
        save_gguf(device, {"x": np.ones(3, np.float32)}, "arch")
    assert stat.S_ISBLK(os.stat(device).st_mode) and os.listdir(tmp_path) == ["disk"]


@pytest.mark.parametrize("through_link", [False, True])
def test_read_only_file_is_refused_even_as_root(tmp_path, through_link):
    path = small_file(tmp_path / "model.gguf")
    before = path.read_bytes()
    path.chmod(0o444)
    target = path
    if through_link:
        target = tmp_path / "link.gguf"
        target.symlink_to(path)
    with pytest.raises(WriteError, match=rf"cannot write .*{target.name}: it is read-only"):
        save_gguf(target, {"y": np.ones(2)}, "other")
    assert path.read_bytes() == before
    assert len(os.listdir(tmp_path)) == 1 + through_link


def test_directory_output_is_refused_before_writing(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(WriteError, match=r"cannot write .*d: it is a directory"):
        save_gguf(tmp_path / "d", {"y": np.ones(2)}, "other")
    assert os.listdir(tmp_path) == ["d"]
