"""Mutated files given to the library loaders (in the bounded child): GGUF models, graph
files, checkpoints and IDX files and directories. Each comes back valid or refused with the
documented error (GGUFFormatError and its subclasses, MnistDataError) in one line naming the
file; a refused checkpoint leaves the params and the optimizer as they were."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.checks import check_load, fuzz_settings
from tests.fuzz.files import CHECKPOINT_OPTIMIZERS, apply, gguf_fields, gz, idx_fields, mutations
from tests.mnist_target.data_files import idx_images, idx_labels, sample_pixels, write_idx_dir

pytestmark = pytest.mark.fuzz

_FIELDS: dict[str, list] = {}


def _gguf_case(env, data, name: str, header_only: bool = False):
    original = env.valid[name]
    if name not in _FIELDS:
        _FIELDS[name] = gguf_fields(original)
    changes = data.draw(mutations(original, _FIELDS[name], header_only), label="mutations")
    return apply(original, changes), (name, changes)


@fuzz_settings(short=12, long=8000)
@given(data=st.data())
def test_model_files(fuzz_env, data):
    name = data.draw(st.sampled_from(["model-cnn", "model-cnn", "model-fc"]), label="file")
    mutated, shown = _gguf_case(fuzz_env, data, name)
    check_load(fuzz_env, "model", mutated, shown)


@fuzz_settings(short=12, long=8000)
@given(data=st.data())
def test_gguf_headers_that_lie(fuzz_env, data):
    """Counts, lengths, types, dims and offsets edited in the header only (any GGUF file)."""
    name = data.draw(st.sampled_from(["model-cnn", "graph", "ckpt-adam"]), label="file")
    mutated, shown = _gguf_case(fuzz_env, data, name, header_only=True)
    check_load(fuzz_env, "gguf", mutated, shown)


@fuzz_settings(short=12, long=8000)
@given(data=st.data())
def test_graph_files(fuzz_env, data):
    mutated, shown = _gguf_case(fuzz_env, data, "graph",
                                header_only=data.draw(st.booleans(), label="header_only"))
    check_load(fuzz_env, "graph", mutated, shown)


@fuzz_settings(short=12, long=8000)
@given(data=st.data())
def test_checkpoints(fuzz_env, data):
    name = data.draw(st.sampled_from(sorted(CHECKPOINT_OPTIMIZERS)), label="saved with")
    # mostly loaded by the optimizer that saved it; sometimes by another one
    option = data.draw(st.sampled_from([name, name, name, *sorted(CHECKPOINT_OPTIMIZERS)]),
                       label="loaded by")
    mutated, shown = _gguf_case(fuzz_env, data, f"ckpt-{name}",
                                header_only=data.draw(st.booleans(), label="header_only"))
    check_load(fuzz_env, "checkpoint", mutated, shown, option=option)


def _idx_content(images: bool, n: int, seed: int) -> bytes:
    pixels, labels = sample_pixels(n, seed)
    return idx_images(pixels) if images else idx_labels(labels)


@st.composite
def idx_mutation(draw, images: bool):
    """(bytes as stored, suffix, what was done): an IDX file's header or data mutated, then
    stored plain, gzipped, or gzipped with the compressed bytes mutated."""
    content = _idx_content(images, draw(st.integers(1, 12)), 0)
    fields = idx_fields(content, images)
    changes = draw(mutations(content, fields, header_only=draw(st.booleans())))
    mutated = apply(content, changes)
    storage = draw(st.sampled_from(["plain", "gz", "gz-bytes"]))
    if storage == "plain":
        return mutated, "", (changes, storage)
    packed = gz(mutated)
    if storage == "gz-bytes":
        packed = apply(packed, draw(mutations(packed, idx_fields(packed, False))))
    return packed, ".gz", (changes, storage)


@fuzz_settings(short=12, long=8000)
@given(images=st.booleans(), data=st.data())
def test_idx_files(fuzz_env, images, data):
    stored, suffix, shown = data.draw(idx_mutation(images), label="idx")
    check_load(fuzz_env, "idx_images" if images else "idx_labels", stored, shown,
               suffix=f"-idx{3 if images else 1}-ubyte{suffix}")


@fuzz_settings(short=6, long=3000)
@given(data=st.data())
def test_idx_directories(fuzz_env, data):
    """The four files of a directory, one of them mutated (or replaced by a FIFO, a link
    loop, a directory) or their counts disagreeing."""
    from pathlib import Path

    from mnist_target.idx import IDX_FILES
    gz_all = data.draw(st.booleans(), label="gz")
    directory = Path(fuzz_env.cases) / "idx-dir"
    shutil.rmtree(directory, ignore_errors=True)
    role = data.draw(st.sampled_from(sorted(IDX_FILES)), label="role")
    images = role.endswith("images")
    kind = data.draw(st.sampled_from(["mutated", "mutated", "fifo", "loop", "dir", "count"]),
                     label="kind")
    replace = {}
    if kind == "count":
        replace[IDX_FILES[role]] = _idx_content(images, data.draw(st.integers(1, 14)), 3)
    elif kind == "mutated":
        content = _idx_content(images, 7 if role.startswith("test") else 12, 1)
        replace[IDX_FILES[role]] = apply(content, data.draw(mutations(
            content, idx_fields(content, images)), label="mutations"))
    write_idx_dir(directory, 12, 7, gz=gz_all, replace=replace)
    target = directory / (IDX_FILES[role] + (".gz" if gz_all else ""))
    if kind in ("fifo", "loop", "dir"):
        os.remove(target)
        {"fifo": os.mkfifo, "dir": os.mkdir,
         "loop": lambda p: os.symlink(os.path.basename(p), p)}[kind](target)
    check_load(fuzz_env, "idx_dir", b"", (role, kind, gz_all, replace and "see mutations"),
               path=str(directory))
