"""The valid files the fuzz suite mutates, the GGUF layout it aims at, and the mutations.

    write_valid_files(directory)     # model-fc.gguf, model-cnn.gguf, graph.gguf, ckpt-*.gguf
    fields = gguf_fields(data)       # every header field: offset, size, kind, label
    data = apply(data, mutations)    # the mutations drawn by gguf_mutations / idx_mutations

A GGUF file (little-endian, version 3): magic "GGUF", version u32, tensor_count u64,
kv_count u64; each KV a key (u64 length + bytes), a value type u32 and the value (a string
is u64 length + bytes; an array is element type u32, count u64 and the elements); each tensor
info a name (u64 length + bytes), n_dims u32, ne u64 each, type u32, offset u64; padding to
the alignment; the data. An IDX file: magic u32 and one u32 per dimension, big-endian.
"""

from __future__ import annotations

import dataclasses
import gzip
import struct

import numpy as np
from hypothesis import strategies as st

# GGUF value type -> size of a scalar of it (STRING 8, ARRAY 9 are walked)
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
U32_EDGES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 64, 255, 2**16, 2**31 - 1, 2**31,
             2**32 - 1)
U64_EDGES = (0, 1, 2, 63, 64, 65, 4096, 65536, 65537, 2**31, 2**32 - 1, 2**32, 2**62,
             2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1)
CHECKPOINT_OPTIMIZERS = {"adam": {"amsgrad": True}, "adamw": {}, "sgd": {"momentum": 0.9}}


@dataclasses.dataclass(frozen=True)
class Field:
    """One header field of a file: bytes [offset, offset + size), its kind (u32, u64, type,
    bytes, f64...) and what it is (label), e.g. "kv 3 (node.dims) count"."""
    offset: int
    size: int
    kind: str
    label: str


# --- valid files -------------------------------------------------------------------------------

def checkpoint_params(optimizer: str):
    """Two params, x (2, 3) and b (3,), and an optimizer over them (as saved and as loaded)."""
    import engine
    from engine.optim import SGD, Adam, AdamW
    x, b = engine.param((2, 3), name="x"), engine.param((3,), name="b")
    x.set(np.arange(6.0).reshape(2, 3))
    b.set(np.full(3, 0.5))
    cls = {"adam": Adam, "adamw": AdamW, "sgd": SGD}[optimizer]
    return [x, b], cls([x, b], lr=0.01, **CHECKPOINT_OPTIMIZERS[optimizer])


def small_training_graph():
    """A tiny classifier's training graph (matmul, add, relu, cross-entropy, AdamW, gradient
    accumulation over two batches) with its roles, as save_graph takes them."""
    from engine import ops
    from engine.tensor import input_tensor, param
    from engine.train import Trainer
    rng = np.random.default_rng(0)
    images = input_tensor((2, 6), "f32", name="images")
    w, b = param((3, 6), "f32", name="w"), param((3,), "f32", name="b")
    w.set(rng.normal(size=(3, 6)).astype(np.float32))
    b.set(np.zeros(3, np.float32))
    logits = ops.relu(ops.add(ops.matmul(images, ops.transpose(w)), b)).set_output()
    labels = input_tensor((2, 3), "f32", name="labels")
    trainer = Trainer(images, logits, loss_type="cross_entropy", labels=labels,
                      optimizer="adamw", opt_params={"lr": 1e-2}, batch_logical=4)
    return trainer.training, {"images": images, "logits": logits, "labels": labels,
                              "loss": trainer.loss}


def write_valid_files(directory) -> dict[str, str]:
    """The valid GGUF files, each written by the project's own save function; name -> path."""
    from engine.graph_io import save_graph
    from engine.optim.checkpoint import save_checkpoint
    from mnist_target.models import Model
    paths = {}
    for arch in ("fc", "cnn"):
        paths[f"model-{arch}"] = str(directory / f"model-{arch}.gguf")
        Model.new(arch, seed=0).save(paths[f"model-{arch}"])
    graph, roles = small_training_graph()
    paths["graph"] = str(directory / "graph.gguf")
    save_graph(paths["graph"], graph, roles, metadata={"run": "fuzz"})
    for name in CHECKPOINT_OPTIMIZERS:
        params, opt = checkpoint_params(name)
        for i in range(2):
            for p in params:
                opt.grads[p].set(np.cos(p.numpy() * (i + 1)))
            opt.step()
        paths[f"ckpt-{name}"] = str(directory / f"ckpt-{name}.gguf")
        save_checkpoint(paths[f"ckpt-{name}"], params, opt)
    return paths


# --- the GGUF layout ---------------------------------------------------------------------------

def gguf_fields(data: bytes) -> list[Field]:
    """Every field of a valid little-endian GGUF file's header, in file order."""
    fields, pos = [Field(0, 4, "bytes", "magic"), Field(4, 4, "u32", "version"),
                   Field(8, 8, "u64", "tensor_count"), Field(16, 8, "u64", "kv_count")], 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def string(label):
        nonlocal pos
        (length,) = struct.unpack_from("<Q", data, pos)
        fields.extend([Field(pos, 8, "u64", f"{label} length"),
                       Field(pos + 8, length, "bytes", label)])
        pos += 8 + length
        return data[pos - length:pos].decode()

    def scalar(kind, label):
        nonlocal pos
        size = _SCALAR_BYTES[kind]
        fields.append(Field(pos, size, f"v{kind}", label))
        pos += size

    def u32(kind, label):
        nonlocal pos
        (value,) = struct.unpack_from("<I", data, pos)
        fields.append(Field(pos, 4, kind, label))
        pos += 4
        return value

    for i in range(n_kv):
        key = string(f"kv {i} key")
        at = f"kv {i} ({key})"
        kind = u32("type", f"{at} type")
        if kind == 8:
            string(f"{at} value")
        elif kind == 9:
            element, count = struct.unpack_from("<IQ", data, pos)
            fields.extend([Field(pos, 4, "type", f"{at} element type"),
                           Field(pos + 4, 8, "u64", f"{at} count")])
            pos += 12
            for j in range(count):
                string(f"{at}[{j}]") if element == 8 else scalar(element, f"{at}[{j}]")
        else:
            scalar(kind, f"{at} value")
    for i in range(n_tensors):
        name = string(f"tensor {i} name")
        at = f"tensor {i} ({name})"
        n_dims = u32("u32", f"{at} n_dims")
        fields.extend(Field(pos + 8 * d, 8, "u64", f"{at} ne[{d}]") for d in range(n_dims))
        pos += 8 * n_dims
        fields.extend([Field(pos, 4, "ttype", f"{at} type"),
                       Field(pos + 4, 8, "u64", f"{at} offset")])
        pos += 12
    fields.append(Field(pos, len(data) - pos, "data", "padding and data"))
    return fields


def idx_fields(data: bytes, images: bool) -> list[Field]:
    dims = ("n", "rows", "cols") if images else ("n",)
    head = [Field(0, 4, "be32", "magic")] + [Field(4 + 4 * i, 4, "be32", d)
                                             for i, d in enumerate(dims)]
    end = 4 + 4 * len(dims)
    return [*head, Field(end, len(data) - end, "data", "data")]


# --- mutations ---------------------------------------------------------------------------------

@st.composite
def field_value(draw, field: Field, data: bytes) -> bytes:
    """New bytes for `field`: an edge value, its own value +-1, a wrong type id, random."""
    if field.kind in ("bytes", "data") or field.size == 0:
        raw = bytearray(data[field.offset:field.offset + field.size])
        for _ in range(draw(st.integers(1, 3))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    own = int.from_bytes(data[field.offset:field.offset + field.size],
                         "big" if field.kind == "be32" else "little")
    edges = U64_EDGES if field.size == 8 else U32_EDGES
    if field.kind == "be32":
        edges = (*U32_EDGES, 0x801, 0x803, 0x802, 0x903, 0x08030000, 27, 29, 300_000, 300_001)
    value = draw(st.one_of(st.sampled_from(edges), st.sampled_from((own - 1, own + 1, own * 2)),
                           st.integers(0, 2 ** (8 * field.size) - 1)))
    if field.kind == "be32":
        return struct.pack(">I", value % 2**32)
    return (value % 2 ** (8 * field.size)).to_bytes(field.size, "little")


@st.composite
def mutations(draw, data: bytes, fields: list[Field], header_only: bool = False):
    """1 to 3 mutations of `data`, as ("set", offset, bytes) edits (applied first, at the
    original offsets) then at most one of ("insert", offset, bytes), ("delete", offset, n),
    ("truncate", length), ("append", bytes)."""
    header = [f for f in fields if f.kind != "data"]
    edits = []
    for _ in range(draw(st.integers(0 if not header_only else 1, 3))):
        field = draw(st.sampled_from(header if header_only or draw(st.booleans()) else fields))
        edits.append(("set", field.offset, draw(field_value(field, data))))
    header_end = fields[-1].offset
    length_changes = st.one_of(
        st.none(),
        st.builds(lambda n: ("truncate", n), st.one_of(
            st.sampled_from([0, 1, 3, 4, 7, 8, 16, 24, header_end, len(data) - 1]),
            st.sampled_from([f.offset for f in fields] + [f.offset + f.size for f in fields]),
            st.integers(0, max(len(data) - 1, 0)))),
        st.builds(lambda at, raw: ("insert", at, raw), st.integers(0, header_end),
                  st.binary(min_size=1, max_size=16)),
        st.builds(lambda at, n: ("delete", at, n), st.integers(0, header_end),
                  st.integers(1, 16)),
        st.builds(lambda raw: ("append", raw), st.binary(min_size=1, max_size=64)))
    last = draw(length_changes)
    if not edits and last is None:
        last = ("truncate", draw(st.integers(0, max(len(data) - 1, 0))))
    return edits + ([last] if last else [])


def apply(data: bytes, changes) -> bytes:
    out = bytearray(data)
    for change in changes:
        if change[0] == "set":
            _, at, raw = change
            out[at:at + len(raw)] = raw
        elif change[0] == "insert":
            out[change[1]:change[1]] = change[2]
        elif change[0] == "delete":
            del out[change[1]:change[1] + change[2]]
        elif change[0] == "truncate":
            del out[change[1]:]
        else:
            out += change[1]
    return bytes(out)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1, mtime=0)
