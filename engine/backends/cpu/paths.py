"""The CPU backend's fast paths: which ones a computation takes, and a plain mode with none.

Every fast path of the CPU kernels (a kernel split into chunks on the engine's threads, the
zero-skipping matmul, the tiled transposed copy, the tiled max pooling, col2im's scatter,
im2col's and col2im's rows, the chunked sums, the streamed broadcasts and copies, the column bands
of get_rows_back's scatter, numba's parallel compilations, the activations' vectorised float32 math,
attention's compiled tasks, a 16-bit product's kept temporaries and conversions inside its
chunks) has a plain twin, and gradcheck's
scale tier compares the two.
Three tools make that possible:

- `plain()`: while the block runs, kernels bound or run take their plain twins only: one
  thread and no chunks, BLAS for every product, numpy's copies, the general pooling
  kernels, im2col's and col2im's gathers, sums by numpy in float64, get_rows_back in one
  band, serial compilations, the activations' libm math, attention's Python loop over
  numpy's matmuls, new temporaries for a 16-bit product. It is the independent float64
  reference of the scale tier (where torch has no equivalent) and a way to tell whether a
  wrong result comes from a fast path. A plan bound outside the block keeps the paths it
  was bound with.
- `poisoned()`: arenas allocated in the block are filled with NaN bytes, as reused
  memory holds garbage (np.empty of a big arena gives fresh, zeroed pages).
- `recording()`: a Counter of the fast paths taken while the block runs, by name (see
  KNOWN), counted when a kernel is bound (a plan binds once) or, for choices made from
  the data, when it runs. gradcheck's scale rows show them; tests assert that each scale
  case takes the path it is there for.

    with paths.recording() as taken:
        graph.compute("cpu")
    taken["matmul:sparse_left"]        # > 0: the zero-skipping product ran
"""

from __future__ import annotations

import collections
import contextlib

PLAIN = False
POISON = False         # new arenas filled with 0xFF bytes (NaN as float): see poisoned()

# Every fast path's family. A recorded name is its family's, or starts with it: "split:"
# paths carry the kernel's name ("split:cpu_relu"), the sparse product its side and split
# ("matmul:sparse_left/rows+blas"); see family().
KNOWN = {
    "split": "a kernel's output split into chunks run side by side on the engine's threads",
    "matmul:sparse": "the zero-skipping product (a sparse operand's zeros skipped)",
    "matmul:blas_chunks": "a dense product as row or column ranges on the engine's threads",
    "copy:tiled": "a transposed view copied in 8 x 8 tiles",
    "copy:streaming": "a big copy of contiguous rows (concat's blocks, cont) written with "
                      "streaming stores, instead of ordinary stores or numpy's copy",
    "pool_2d:tiled": "max pooling whose windows tile the image, forward",
    "pool_2d_back:tiled": "max pooling whose windows tile the image, backward",
    "im2col_back:scatter": "col2im scattering each image's column vectors into a float64 "
                           "image, instead of a gather per image cell",
    "im2col:rows": "NKHW columns written as shifted rows of each image plane, instead of "
                   "the gather into their NHWK view",
    "im2col_back:rows": "col2im from NKHW columns adding whole rows into a float64 plane "
                        "per (image, channel), instead of the gather from their NHWK view",
    "conv_2d:columns": "conv_2d and its backward ops on each image's columns in an L2-sized "
                       "scratch, multiplied at once, instead of im2col's batch of columns, "
                       "batched products and col2im",
    "sum:chunks": "a whole-tensor sum in chunks, each accumulated privately",
    "sum:chunks_split": "a whole-tensor sum's chunks as ranges on the engine's threads",
    "sum:rows": "a sum over rows into chunked float64 accumulator rows",
    "sum:runs": "a sum of contiguous runs into vertical accumulators",
    "sum:runs_grouped": "many short runs (a channel's bias gradient) added eight at a time "
                        "into the vertical accumulators, instead of run by run",
    "sum:lanes": "16-bit runs summed in float64 vector lanes, in the compiler's order",
    "sum:runs_split": "kept elements' sums as ranges on the engine's threads",
    "broadcast:streaming": "a big broadcast written as compiled row fills or row copies "
                           "with streaming stores, instead of numpy's fill or copy",
    "get_rows_back:bands": "get_rows_back's scatter-add split into column bands",
    "parallel": "a kernel's numba parallel compilation (GRADVERIFY_PARALLEL=1)",
    "vector": "an activation's float32 kernel on vectorised float64 math instead of a libm "
              "call per element (engine.backends.cpu.vector_unary)",
    "stream": "an elementwise map's big float32 output computed in blocks in the cache and "
              "written with streaming stores (engine.backends.cpu.elementwise._STREAMING)",
    "half": "a plain op's 16-bit kernel on the patterns in one pass instead of float32 "
            "temporaries (engine.backends.cpu.elementwise.HALF_NATIVE)",
    "widen:scratch": "a 16-bit product's float32 temporaries in buffers its thread keeps "
                     "between calls, instead of new arrays per call",
    "widen:fused": "a 16-bit product's conversions inside its BLAS chunks (each chunk "
                   "widening its rows of the left operand or a part of an operand all read, "
                   "and rounding its rows of the output), instead of before and after the "
                   "product",
    "attention:tiles": "attention's query rows in blocks, each block's products apart",
    "attention:causal_skip": "causal attention's blocks skipping the keys none of their "
                             "rows sees",
    "attention:compiled": "each (batch, head) task of attention one compiled call, its "
                          "products in SciPy's BLAS, instead of numpy's matmuls between "
                          "row kernels",
    "attention:head_tasks": "grouped-query attention's backward as (batch, query head) "
                            "tasks, each head's dk and dv a partial of its own, summed "
                            "after in head order",
}

_recorders: list[collections.Counter] = []


def family(path: str) -> str:
    """The KNOWN family of a recorded path: "split:cpu_relu" -> "split", "vector:gelu" ->
    "vector", "stream:sgn" -> "stream", "matmul:sparse_left/rows+blas" -> "matmul:sparse"."""
    if path.startswith(("split:", "vector:", "half:", "stream:")):
        return path.split(":", 1)[0]
    if path.startswith("matmul:sparse"):
        return "matmul:sparse"
    return path


def taken(path: str) -> None:
    """Count fast path `path` in every recording open now (nothing to do without one)."""
    for counter in _recorders:
        counter[path] += 1


@contextlib.contextmanager
def recording():
    """A Counter of the fast paths taken while the block runs (see the module doc)."""
    counter: collections.Counter = collections.Counter()
    _recorders.append(counter)
    try:
        yield counter
    finally:
        # by identity: Counters compare by their counts, so list.remove could take a nested
        # recording's equal twin out instead and leave this one behind
        del _recorders[next(i for i, c in enumerate(_recorders) if c is counter)]


@contextlib.contextmanager
def _switched_on(name: str):
    """Module switch `name` (PLAIN or POISON) on while the block runs, as it was after."""
    before = globals()[name]
    globals()[name] = True
    try:
        yield
    finally:
        globals()[name] = before


def poisoned():
    """Arenas allocated in the block hold garbage, all bytes 0xFF (a NaN in every float
    dtype), as an arena reused from another graph would: a kernel that leaves part of its
    output unwritten, right only on fresh zeroed memory, then gives NaN (gradcheck runs the
    engine under test this way)."""
    return _switched_on("POISON")


def plain():
    """Kernels bound or run in the block take their plain twins only (module doc)."""
    return _switched_on("PLAIN")
