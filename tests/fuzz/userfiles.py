"""The directory of "user files" the command lines are pointed at, and its fingerprint.

    paths = make_user_dir(tmp / "user")     # valid and broken models, IDX sets, FIFOs, ...
    before = fingerprint(tmp / "user")      # must equal fingerprint(...) after every run

Nothing in it may change when a tool runs: the tools write only where they are told, and
the outputs the fuzzer gives them inside this directory are ones that must be refused (a
read-only file, a directory, a link loop, a FIFO is never an output here).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import stat
import struct
from pathlib import Path

from tests.fuzz.files import apply, gguf_fields, write_valid_files
from tests.mnist_target.data_files import idx_images, write_idx_dir

N_TRAIN, N_TEST = 40, 20
IMAGES, LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"


def _set_field(data: bytes, label_part: str, value: int, size: int = 8) -> bytes:
    field = next(f for f in gguf_fields(data) if label_part in f.label)
    return apply(data, [("set", field.offset, (value % 2 ** (8 * size)).to_bytes(size,
                                                                               "little"))])


def _idx_dirs(user: Path) -> None:
    write_idx_dir(user / "idx", N_TRAIN, N_TEST)
    write_idx_dir(user / "idx-gz", N_TRAIN, N_TEST, gz=True)
    write_idx_dir(user / "idx-bad", N_TRAIN, N_TEST)
    with open(user / "idx-bad" / IMAGES, "r+b") as f:
        f.truncate(16 + 784 * N_TRAIN - 100)
    write_idx_dir(user / "idx-fifo", N_TRAIN, N_TEST)
    os.remove(user / "idx-fifo" / IMAGES)
    os.mkfifo(user / "idx-fifo" / IMAGES)
    write_idx_dir(user / "idx-mismatch", N_TRAIN, N_TEST)
    labels = (user / "idx-mismatch" / LABELS).read_bytes()
    (user / "idx-mismatch" / LABELS).write_bytes(
        struct.pack(">II", 0x801, N_TRAIN - 1) + labels[8:-1])
    write_idx_dir(user / "idx-labels", N_TRAIN, N_TEST)
    labels = bytearray((user / "idx-labels" / LABELS).read_bytes())
    labels[8] = 10
    (user / "idx-labels" / LABELS).write_bytes(bytes(labels))
    # a gzip bomb: 20 images declared, 64 MiB of zeros after them
    write_idx_dir(user / "idx-bomb", N_TRAIN, N_TEST, gz=True)
    with gzip.open(user / "idx-bomb" / "t10k-images-idx3-ubyte.gz", "wb", compresslevel=9) as f:
        f.write(idx_images([[0] * 784] * N_TEST))
        for _ in range(64):
            f.write(bytes(1 << 20))


def make_user_dir(user: Path) -> dict[str, str]:
    """The user files (see the module docstring); returns the valid GGUF files' paths."""
    user.mkdir(parents=True)
    paths = write_valid_files(user)
    from mnist_target.models import Model
    from mnist_target.run import TrainConfig, export_training_graph
    export_training_graph(Model.new("cnn", seed=0), TrainConfig(batch_logical=10,
                                                                batch_physical=10),
                          user / "graph-mnist.gguf")
    cnn = Path(paths["model-cnn"]).read_bytes()
    graph = Path(paths["graph"]).read_bytes()
    broken = {
        "mut-truncated.gguf": cnn[:300], "mut-count.gguf": _set_field(cnn, "tensor_count", 2**63),
        "mut-type.gguf": _set_field(cnn, "tensor 0 (conv1.kernel) type", 99, 4),
        "mut-ne.gguf": _set_field(cnn, "ne[0]", 2**62),
        "mut-offset.gguf": _set_field(cnn, "tensor 1 (conv1.bias) offset", 1),
        "mut-graph-srcs.gguf": _set_field(graph, "(graph.node.srcs)[0]", 10**6),
        "empty.gguf": b"", "notgguf.txt": b"GGUF is not here\n"}
    for name, data in broken.items():
        (user / name).write_bytes(data)
    shutil.copy(paths["model-cnn"], user / "readonly.gguf")
    (user / "readonly.json").write_text("{}\n")
    for name in ("readonly.gguf", "readonly.json"):
        os.chmod(user / name, 0o444)
    os.mkfifo(user / "fifo")
    os.symlink("loop", user / "loop")
    os.symlink("missing-target", user / "dangling")
    (user / "dir").mkdir()
    (user / "badlib").mkdir()
    for lib in ("libggml.so", "libggml-base.so", "libggml-cpu.so"):
        (user / "badlib" / lib).write_bytes(b"\x7fELF not really\n")
    _idx_dirs(user)
    return paths


def fingerprint(root: Path) -> dict[str, tuple]:
    """relative path -> (kind, mode, size, sha256 or link target), links not followed and
    FIFOs never opened."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = os.path.join(directory, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_size, digest)
            else:
                out[rel] = ("other", st.st_mode)
    return out


def changes(before: dict, after: dict) -> list[str]:
    """The paths added, removed or changed between two fingerprints."""
    def what(p):
        return "added" if p not in before else "removed" if p not in after else "changed"
    return sorted(f"{p} {what(p)}" for p in before.keys() | after.keys()
                  if before.get(p) != after.get(p))
