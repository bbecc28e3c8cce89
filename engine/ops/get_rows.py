"""get_rows: rows of a table picked by int32 indices (ggml's GET_ROWS), and its dedicated
backward get_rows_back (ggml's GET_ROWS_BACK).

For a float table of shape (R, C) and int32 indices idx of shape (K,) or (B, K):

    get_rows(table, idx)[..., k, :] = table[idx[..., k], :]            shape idx.shape + (C,)
    get_rows_back(g, idx, R)[r, :] = sum of g[..., k, :] over every k with idx[..., k] = r

(one table shared by the whole batch). The table's gradient is get_rows_back(g, idx, R): a
row picked n times gets the sum of its n gradient rows; a row never picked gets zeros. idx
gets no gradient. get_rows_back is linear in g and its own gradient is get_rows.

Indices are data, so their range is checked when the graph runs: an index outside [0, R)
raises engine.errors.RowIndexError (an EngineError) from the kernel's dispatcher, before any
memory is touched. torch: table[idx.long()].
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.cpu.get_rows import cpu_get_rows, cpu_get_rows_back
from engine.errors import DTypeError, ShapeError
from engine.params import Params, int_param, integer
from engine.registry import OpDef, VJPOf, make_node, register, shapes_str
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import SIDE, bench_case, scale_case
from engine.strategies import MAX_ELEMENTS, draw_input, draw_layout, sample_strategy
from engine.tensor import is_float

INDEX_DTYPE = np.dtype(np.int32)


def _check_idx(op, idx, other):
    if idx.dtype != INDEX_DTYPE:
        raise DTypeError(f"{op}: indices must be int32, got {idx.dtype} (shapes "
                         f"{shapes_str(other, idx)})")
    if idx.ndim not in (1, 2):
        raise ShapeError(f"{op}: indices must have shape (K,) or (B, K), got "
                         f"{list(idx.shape)}")


def _get_rows_infer(table, idx):
    if not is_float(table.dtype):
        raise DTypeError(f"get_rows: the table must be float, got {table.dtype} (shapes "
                         f"{shapes_str(table, idx)})")
    if table.ndim != 2:
        raise ShapeError(f"get_rows: the table must have shape (R, C), got "
                         f"{list(table.shape)}")
    _check_idx("get_rows", idx, table)
    return idx.shape + table.shape[1:], table.dtype


def get_rows(table, idx):
    """table[idx]: the rows of the (R, C) table at int32 indices idx of shape (K,) or
    (B, K); an index outside [0, R) raises RowIndexError when the graph runs."""
    return make_node("get_rows", (table, idx))


def _get_rows_back_infer(g, idx, nrows):
    if not is_float(g.dtype):
        raise DTypeError(f"get_rows_back: the gradient must be float, got {g.dtype}")
    _check_idx("get_rows_back", idx, g)
    if g.ndim != idx.ndim + 1 or g.shape[:-1] != idx.shape:
        raise ShapeError(f"get_rows_back: the gradient must have shape indices.shape + (C,), "
                         f"got {shapes_str(g, idx)}")
    return (nrows, g.shape[-1]), g.dtype


def get_rows_back(g, idx, nrows):
    """The (nrows, C) gradient of a table given g, the gradient of get_rows(table, idx):
    zeros, with g[..., k, :] added to row idx[..., k] for every k (repeats add up)."""
    return make_node("get_rows_back", (g, idx), nrows=integer("get_rows_back", "nrows", nrows))


def _torch_get_rows(table, idx):
    return table[idx.long()]


def _torch_get_rows_back(g, idx, nrows):
    import torch
    out = torch.zeros((nrows, g.shape[-1]), dtype=g.dtype)
    return out.index_add(0, idx.reshape(-1).long(), g.reshape(-1, g.shape[-1]))


# --- samples and registration ---------------------------------------------------------------
def _idx(shape, nrows, permute=None, **view):
    return InputSpec("idx", shape, "int", 0, nrows, dtype="i32", grad=False, permute=permute,
                     **view)


# (R, C, idx shape, idx permute): ggml's cases (a 5 x 10 table, 3 indices, batches, a
# strided view of the indices, one column) and repeated indices (more indices than rows)
CASES = [(5, 10, (3,), None), (5, 10, (8,), None), (8, 1, (2,), None), (1, 6, (4,), None),
         (5, 4, (2, 3), None), (4, 3, (3, 6), (1, 0)), (6, 40, (7,), None)]


@both_dtypes
def _get_rows_samples(dtype):
    out = [Sample.make("get_rows", [InputSpec("table", (r, c)), _idx(k, r, p)], dtype)
           for r, c, k, p in CASES]
    out.append(Sample.make("get_rows", [InputSpec("table", (5, 6), permute=(1, 0)),
                                        _idx((9,), 5)], dtype))
    # a sliced table (an offset and steps) and sliced indices; an expanded table (stride
    # 0: every row the same) and expanded indices (one index repeated per row)
    out += [Sample.make("get_rows", [InputSpec("table", (5, 6), slice=((1, 6, 1), (0, 12, 2))),
                                     _idx((4, 3), 5, slice=((1, 5, 1), (0, 6, 2)))], dtype),
            Sample.make("get_rows", [InputSpec("table", (5, 6), slice=((1, 6, 1), (1, 7, 1))),
                                     _idx((7,), 5)], dtype),
            Sample.make("get_rows", [InputSpec("table", (4, 6), expand=(0,)),
                                     _idx((3, 5), 4, expand=(1,))], dtype)]
    return out


@both_dtypes
def _get_rows_back_samples(dtype):
    out = [Sample.make("get_rows_back", [InputSpec("g", k + (c,)), _idx(k, r, p)], dtype,
                       nrows=r) for r, c, k, p in CASES]
    out.append(Sample.make("get_rows_back", [InputSpec("g", (4, 6, 2), permute=(1, 0, 2)),
                                             _idx((4, 6), 3, (1, 0))], dtype, nrows=3))
    # g a stride-0 broadcast: along the columns, and one gradient row for every index
    out += [Sample.make("get_rows_back", [InputSpec("g", k + (c,), expand=e), _idx(k, r)],
                        dtype, nrows=r)
            for r, c, k, e in [(5, 4, (8,), (1,)), (4, 3, (2, 6), (0, 1))]]
    return out


def _get_rows_back_primals(g, idx, nrows):
    """get_rows_back(g, idx, nrows) is get_rows's VJP with respect to an (nrows, C) table
    (get_rows is linear in the table: any table, here zeros)."""
    return {"table": np.zeros((nrows, g.shape[-1])), "idx": idx}, g, {}


def _strategy(op):
    @sample_strategy
    def strategy(draw, dtype):
        from hypothesis import strategies as st
        k_shape = tuple(draw(st.lists(st.integers(1, 8), min_size=1, max_size=2)))
        nrows = draw(st.integers(1, 6))
        ncols = draw(st.integers(1, min(8, MAX_ELEMENTS // math.prod(k_shape))))
        idx = _idx(k_shape, nrows, **draw(draw_layout(k_shape)))
        if op == "get_rows":
            return Sample.make(op, [draw_input(draw, "table", (nrows, ncols)), idx], dtype)
        g = draw_input(draw, "g", k_shape + (ncols,))
        return Sample.make(op, [g, idx], dtype, nrows=nrows)
    strategy.__name__ = f"_{op}_strategy"
    return strategy


def _get_rows_scale():
    """Scale cases: 4096 rows of a (1031, 1031) table gathered at indices that repeat
    about 42 times each (get_rows_back's scatter-add, in column bands, must add every
    repeat), and a transposed table."""
    idx = InputSpec("idx", (4096,), "int", 0, 97, dtype="i32", grad=False)
    return [scale_case("get_rows", [InputSpec("table", (SIDE, SIDE)), idx]),
            scale_case("get_rows", [InputSpec("table", (SIDE, SIDE), permute=(1, 0)), idx])]


def _get_rows_bench():
    """Bench case: a language model's token embedding, 4096 tokens of a (32000, 1024)
    table (its gradient a scatter-add into the whole table)."""
    return [bench_case("get_rows", [InputSpec("table", (32000, 1024)),
                                    InputSpec("idx", (4096,), "int", 0, 32000, dtype="i32",
                                              grad=False)])]


register(OpDef("get_rows", params={}, scale=_get_rows_scale, bench=_get_rows_bench,
               infer=_get_rows_infer,
               backward=lambda g, out, table, idx: (get_rows_back(g, idx, table.shape[0]),
                                                    None),
               kernels={"cpu": cpu_get_rows,
                        "cuda": "engine.backends.cuda.get_rows:cuda_get_rows"},
               build=get_rows, torch=_torch_get_rows,
               samples=_get_rows_samples, strategy=_strategy("get_rows"),
               doc="rows of a (R, C) table at int32 indices (K,) or (B, K); gradient: "
                   "get_rows_back (repeated indices add up)"))
register(OpDef("get_rows_back", params=Params(dict(
                   nrows=int_param(1, why="the table's rows; an index is checked against it "
                                          "when the graph runs"))),
               kind="backward", infer=_get_rows_back_infer,
               backward=lambda g, out, gin, idx, nrows: (get_rows(g, idx), None),
               kernels={"cpu": cpu_get_rows_back,
                        "cuda": "engine.backends.cuda.get_rows:cuda_get_rows_back"},
               build=get_rows_back,
               torch=_torch_get_rows_back, samples=_get_rows_back_samples,
               strategy=_strategy("get_rows_back"),
               vjp_of=VJPOf("get_rows", _get_rows_back_primals, "table"),
               doc="scatter-add of g into zeros of (nrows, C) at the indices: the gradient "
                   "of get_rows; its own gradient is get_rows"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.backends.cpu import threads  # noqa: E402
from engine.backends.cpu.jit import parallel_kernel, prange  # noqa: E402
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import kernel_replaced  # noqa: E402


def scatter_split_by_indices(kernel):
    """get_rows_back split among the engine's threads by ranges of the indices (instead of
    column bands) once the work is big enough to split: a table row indexed from two
    ranges is written by two threads, and one thread's adds are lost. Deterministically:
    each range's sums are written, not added, over the rows it indexes, in range order."""
    def mutated(out, ins, nrows):
        g, idx = ins
        parts = threads.parts()
        if parts == 1 or g.size + out.size < threads.MIN_ELEMENTS:
            return kernel(out, ins, nrows=nrows)
        g2, idx1 = g.reshape(-1, g.shape[-1]), idx.reshape(-1)
        out[...] = 0
        mine = np.empty_like(out)
        for lo, hi in threads.bounds(idx1.size, parts):
            kernel(mine, [g2[lo:hi], idx1[lo:hi]], nrows=nrows)    # this range's sums
            rows = np.unique(idx1[lo:hi])
            out[rows] = mine[rows]                     # a store where an add was due
    return mutated


@parallel_kernel
def _scatter_by_rows(g, idx, out):
    """out[idx[p], :] += g[p, :], one prange iteration per gradient row: right in the
    serial compilation; in the parallel one, two threads adding into one table row at once
    lose each other's adds."""
    nc = out.shape[1]
    for p in prange(idx.size):
        orow = out[idx[p]]
        grow = g[p]
        for c in range(nc):
            orow[c] += grow[c]


def scatter_prange_over_indices(kernel):
    """get_rows_back as one prange over the gradient rows instead of column bands: a race
    that exists only when numba's parallel compilations run (GRADVERIFY_PARALLEL=1), which
    the engine's own thread split never takes."""
    def mutated(out, ins, nrows):
        g, idx = ins
        out[...] = 0
        _scatter_by_rows(np.ascontiguousarray(g).reshape(-1, out.shape[1]),
                         np.ascontiguousarray(idx).reshape(-1), out)
    return mutated


mutation.register(
    Mutant("get_rows_back_prange_race", ("get_rows",),
           "get_rows_back's scatter-add written as a prange over the indices: in numba's "
           "parallel compilation two threads add into one table row at once and adds are "
           "lost (4096 indices into 97 rows); the serial compilation is right",
           lambda: kernel_replaced("get_rows_back", scatter_prange_over_indices),
           where=mutation.contiguous, tier="scale", max_cases=1, kind="scatter race"),
    Mutant("get_rows_back_lost_updates", ("get_rows",),
           "get_rows_back's scatter-add, once big enough to split, split among the engine's "
           "threads by ranges of indices instead of column bands: a table row indexed from "
           "two ranges keeps one range's adds (4096 indices into 97 rows)",
           lambda: kernel_replaced("get_rows_back", scatter_split_by_indices),
           where=mutation.contiguous, tier="scale", max_cases=1, kind="scatter race"),
)
