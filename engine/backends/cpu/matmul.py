"""CPU kernel of matmul: BLAS (numpy's matmul), or a product that skips exact zeros.

    out[..., i, j] = sum_k a[..., i, k] b[..., k, j]

Batch axes broadcast as in numpy. Inputs may be strided views (a transposed operand goes to
BLAS as a transposed matrix, without a copy, where numpy can).

The sparse path computes s @ d skipping the zeros of a sparse operand s: s = a (out = a @ b),
or, for a sparse right operand, s = b^T (out^T = b^T @ a^T, into a scratch that is then
transposed into out, each thread's rows while they are still in its cache). The lines of s
(its rows, or else its columns, whichever is cheaper) are split by their measured density:
dense lines go to BLAS, gathered into a compact matrix; the rest to
engine.backends.cpu.matmul_sparse (CSR rows, contiguous row updates).

Costs are counted in multiply-adds on BLAS (BLAS's: m k n). A line of s costs its length
times n on BLAS (DENSE_ROW_COST or DENSE_COL_COST times that: a dense line is gathered, and
in a row split its product rows scattered) and entry_cost(n) times n per non-zero on the
sparse path (SPARSE_ENTRY_COST per multiply-add plus ENTRY_FIXED_COST per non-zero), and goes
to the cheaper (so a row denser than DENSE_ROW_COST / entry_cost(n) goes to BLAS); the sparse
path adds SCAN_COST per element of s (counting), OUT_COST per element of the product (its
rows zeroed, written, and, for a right operand, transposed), GATHER_COST per element of d
when d is not C-contiguous, and CALL_COST per call. The counting and d's copy run on the
calling thread while the engine's other threads wait, so with p threads (against BLAS's p
chunks) they cost p times their share; the model counts them SERIAL_THREADS times whatever
the thread count, so that the path taken, and so the result's bits, do not depend on it.
The path is taken for 2-D float32/float64 products, per side, in this order (left, then
right), when
- the rows of s @ d are long enough to vectorise (n, resp. m, >= SPARSE_MIN_ROW) and
  m k n >= SPARSE_MIN_MACS;
- the estimated cost of the cheaper split is at most SPARSE_MAX_COST of BLAS's: first
  estimated from every SAMPLE_STEP-th line of s (a product whose estimate exceeds
  SAMPLE_MARGIN times that goes to BLAS without a full count), then counted;
- the dense operand d has no NaN or infinity (a skipped 0 * inf would be NaN in BLAS).
Everything else (dense operands, gradcheck's random samples, batched products, small or
skinny products) goes to BLAS. With the engine's threads (engine.backends.cpu.threads), big
products run as chunks side by side (matmul_chunks), and a sparse product as row ranges,
each with its dense lines (SparseProduct.run). For MNIST's FC layer at batch 1000 (s: the
images, 19% non-zero in clustered strokes; n = 500) which path pays depends on the CPU (the
fits below): on the AVX-512 machine both big products go to BLAS (the sparse path's serial
counting and copying cost more than the zeros save), on the AVX2 one both go sparse (0.69 to
0.82 of BLAS's wall time at two threads); at batch 100 none does.

Numerics: the sparse path adds the same non-zero terms as BLAS in another order (dense
lines' products and the sparse part added, the sparse part in column blocks, eight terms at
a time, see matmul_sparse), so results differ from BLAS's by summation order only; a zero
result can differ in its sign.
"""

from __future__ import annotations

import functools
import threading
from typing import NamedTuple

import numba
import numpy as np

from engine.backends.cpu import half, layout, paths, patterns, threads
from engine.backends.cpu import matmul_sparse as sp
from engine.backends.cpu.jit import bindable
from engine.tensor import is_half


class CostFit(NamedTuple):
    """The cost model's constants for one kind of CPU, in multiply-adds on BLAS, each field
    the module constant of its name."""
    SPARSE_ENTRY_COST: float  # a multiply-add on the sparse path
    ENTRY_FIXED_COST: float   # per non-zero of s: its CSR entry written and read, whatever n
    SCAN_COST: float          # per element of s: counting the non-zeros
    OUT_COST: float           # per element of the product: zeroing, writing, transposing
    GATHER_COST: float        # gathering one element of d (when d is not C-contiguous)
    CALL_COST: float          # per call: Python, small numpy steps, parallel regions
    DENSE_COL_COST: float     # a dense column's multiply-adds, gathered, in a column split
    DENSE_ROW_COST: float     # a dense row's, gathered and scattered, in a row split


# The cost model counts in BLAS's multiply-adds, so its constants depend on how fast BLAS
# is against the compiled loops, that is on the vector width of both: one fit per kind of
# CPU, chosen by whether numba compiles for AVX-512 (patterns.target_has). Each fitted on
# one thread to the sparse path's CPU time over BLAS's by `python bench/fit_sparse_matmul.py
# --repeats 11` (least squares over 72 float32 products: m k n = 1000 784 500, 500 784 500,
# 100 784 500, 1000 784 72, 1000 300 500, 300 2000 400; s uniformly random zeros at
# densities 0.01 to 0.1, as the left operand with d C-contiguous or transposed, and as the
# right one), the dense lines' factors then to MNIST's products (`--mnist`, below).
# - AVX-512 (an Intel Xeon, numpy's OpenBLAS at about 140 GFLOP/s a core; the machine
#   shared, CPU time): the model within 0.1 of the measured ratio for most products, 0.2 at
#   worst (at 1% density). The sparse path costs about as much as BLAS at 10% density
#   (measured ratios 0.90 to 1.19 at n >= 400), and never pays at n = 72.
# - AVX2 (an AMD EPYC, Zen 3, numpy's sgemm at about 80 GFLOP/s a core, quiet): the model
#   within 0.1 for most products, 0.2 at worst (300 2000 400 at 10%, d transposed); the
#   sparse path at 10% density costs 0.55-0.74 of BLAS at n >= 400, never pays at n = 72.
#   (The fit before the AVX-512 one, on an older AVX2 EPYC, had SPARSE_ENTRY_COST 3.)
FITS = {
    "avx512": CostFit(SPARSE_ENTRY_COST=6.1, ENTRY_FIXED_COST=640.0, SCAN_COST=60.0,
                      OUT_COST=73.0, GATHER_COST=29.0, CALL_COST=3.75e6, DENSE_COL_COST=1.2,
                      DENSE_ROW_COST=1.8),
    "avx2": CostFit(SPARSE_ENTRY_COST=3.55, ENTRY_FIXED_COST=570.0, SCAN_COST=60.0,
                    OUT_COST=17.6, GATHER_COST=36.0, CALL_COST=4.27e6, DENSE_COL_COST=1.0,
                    DENSE_ROW_COST=1.2),
}
CPU_KIND = "avx512" if patterns.target_has("avx512f") else "avx2"
FIT = FITS[CPU_KIND]
SPARSE_ENTRY_COST = FIT.SPARSE_ENTRY_COST
ENTRY_FIXED_COST = FIT.ENTRY_FIXED_COST
SCAN_COST = FIT.SCAN_COST
OUT_COST = FIT.OUT_COST
GATHER_COST = FIT.GATHER_COST
CALL_COST = FIT.CALL_COST
# A dense line's share on BLAS costs more than its multiply-adds: it is gathered (s's lines,
# and in a column split d's rows), and in a row split its product rows are scattered back.
# Fitted to MNIST's FC products on one thread, `python bench/fit_sparse_matmul.py --mnist
# --repeats 15` (a batch of 500 training images as s in the trainer's layouts; dense lines
# about 0.41 of BLAS's work in each). AVX-512: x @ W^T, split by columns, sparse over BLAS
# measured 0.90-0.93 in three draws (the model: 0.86-0.87); the weight gradient g^T @ x, by
# rows, 1.09-1.16 (the model: 1.07-1.09). AVX2 (`--repeats 9`, three draws): x @ W^T 0.70-0.75
# (the model: 0.95-0.96), g^T @ x 0.82-0.84 (0.99-1.00) with AVX-512's factors; at two
# threads, wall time, 0.69-0.75 and 0.75-0.82. The factors are at least 1 (a dense line is
# BLAS on gathered lines: below 1 a dense operand would look cheaper off BLAS), so the
# columns' stays 1.0 (the model 0.88-0.89, under SPARSE_MAX_COST in 30 draws of 500 images
# out of 30) and the rows' is 1.2 (the model 0.81-0.83).
DENSE_COL_COST = FIT.DENSE_COL_COST
DENSE_ROW_COST = FIT.DENSE_ROW_COST
# The serial steps (counting, d's copy) counted as on this many threads, whatever the engine's
# thread count: the path must not depend on it (a product's bits differ between paths, and a
# plan's bits are the same on every thread count). Two: the AVX-512 machine's cores; on one
# thread the model then leaves MNIST's x @ W^T on BLAS where the sparse path would be about 10%
# faster, on many it takes the sparse path where its serial steps cost more.
SERIAL_THREADS = 2
SPARSE_MAX_COST = 0.9        # take the path at an estimated cost of at most 0.9 of BLAS's
SPARSE_MIN_MACS = 1 << 22    # m k n below this: BLAS (counting would cost more than it saves)
SPARSE_MIN_ROW = 16          # product rows shorter than this do not vectorise well
SAMPLE_STEP = 16             # the estimate reads every 16th line of s
SAMPLE_MARGIN = 1.25
L2_BLOCK_BYTES = 1 << 18     # d's rows are used in blocks of about this many bytes


def entry_cost(n: int) -> float:
    """A non-zero's cost on the sparse path, in BLAS's cost of one element of s (n
    multiply-adds), for products whose rows have n elements."""
    return SPARSE_ENTRY_COST + ENTRY_FIXED_COST / max(n, 1)


def dense_factor(split: str) -> float:
    """What a dense line's multiply-adds cost on BLAS in a split of s's "rows" or "cols"."""
    return DENSE_ROW_COST if split == "rows" else DENSE_COL_COST


def dense_lines(counts, length: int, n: int, split: str) -> np.ndarray:
    """The mask of the lines (of `length` elements, `counts` non-zeros, in a product whose
    rows have n elements; s's rows or columns as `split` says) cheaper on BLAS."""
    return entry_cost(n) * counts > dense_factor(split) * length


class SparseProduct:
    """out = s @ d (or, `transposed`, out^T = s @ d) with s's zeros skipped, for fixed
    arrays (their data read at each run).

    s: (m, k) any strides; d: (k, n) any strides (when not C-contiguous, the rows the
    sparse part uses are gathered into a C-contiguous scratch, or all of d is copied there
    when d is transposed and they are at least half of its rows); out: C-contiguous, (m, n),
    or (n, m) if transposed (then the product goes to a scratch, copied into out by
    layout.transpose_into: on the engine's threads each row range into its columns). Scratch
    arrays are allocated at the first run that needs them."""

    def __init__(self, s, d, out, transposed=False):
        self.s, self.d, self.out, self.transposed = s, d, out, transposed
        m, k = s.shape
        self.by_rows = abs(s.strides[1]) <= abs(s.strides[0]) or m == 1
        # d's rows for the sparse part, C-contiguous, when d is not (allocated by the first
        # run that needs it); copy_d: a copy of all of d into it, where d is transposed
        self.d_scratch = self.copy_d = None
        self.d_transposed = d.T.flags.c_contiguous and not d.flags.c_contiguous
        # d, or d^T where that is C-contiguous, for the NaN and infinity count
        self.d_scan = d.T if self.d_transposed else d
        self.dest = out if not transposed else None
        self.row_counts = np.empty(m, np.int64)
        self.col_counts = np.empty(k, np.int64)
        self.col_partials = np.empty((max(1, min(numba.get_num_threads(), m)), k + 16),
                                     np.int64)
        self.starts = np.zeros(m + 1, np.int64)
        self.ends = np.empty(m, np.int64)
        self.cursor = np.empty(m, np.int64)
        lines = m if self.by_rows else k
        self.sample_lines = np.empty(-(-lines // SAMPLE_STEP), np.int64)
        self.sample_cross = np.empty(k if self.by_rows else m, np.int64)
        self.block = max(16, L2_BLOCK_BYTES // max(1, d.shape[1] * d.itemsize))
        n = d.shape[1]
        self.work = m * k * n
        self.entry = entry_cost(n)
        # the costs besides the lines', in BLAS's cost of one element of s (n multiply-adds);
        # the counting and d's gather run on one thread while the others wait
        serial = SERIAL_THREADS
        self.overhead = ((serial * SCAN_COST * m * k + OUT_COST * m * n + CALL_COST) / n
                         + (0 if d.flags.c_contiguous else serial * GATHER_COST * k))
        self.split = None
        self.cost = None          # the last estimate that `pays` counted, over BLAS's

    def _dense_part(self, lines, d_dense, accumulate, parallel=True):
        """part(r0, r1): the dense lines' share of rows [r0, r1) of the product, by BLAS.
        A column split (accumulate): dest[r0:r1] = s[r0:r1, lines] @ d_dense, before the
        sparse part is added. A row split: dest[i] = s[i] @ d for the dense rows i in
        [r0, r1). `parallel`: numba's gathers may use numba's threads."""
        s, d, dest = self.s, self.d, self.dest
        take = sp.take_columns.for_size(s.size) if parallel else sp.take_columns.serial

        def part(r0, r1):
            if r1 <= r0 or not len(lines):
                return
            if accumulate:
                s_dense = np.empty((r1 - r0, len(lines)), s.dtype)
                take(s[r0:r1], lines, s_dense)
                np.matmul(s_dense, d_dense, out=dest[r0:r1])
                return
            mine = lines[np.searchsorted(lines, r0):np.searchsorted(lines, r1)]
            if len(mine):
                s_dense_t = np.empty((s.shape[1], len(mine)), s.dtype)
                take(s.T, mine, s_dense_t)
                dest[mine] = s_dense_t.T @ d
        return part

    def _scratch(self) -> np.ndarray:
        if self.d_scratch is None:
            self.d_scratch = np.empty(self.d.shape, self.d.dtype)
            self.copy_d = layout.copy_call(self.d_scratch, self.d)
        return self.d_scratch

    def _sample_cost(self) -> float:
        """The lines' cost of the better split estimated from every SAMPLE_STEP-th line."""
        s = self.s
        m, k = s.shape
        sp.sample_counts(s, SAMPLE_STEP, self.by_rows, self.sample_lines, self.sample_cross)
        # a sampled line: a row of s (its length k) if by_rows, else a column
        along = k * DENSE_ROW_COST if self.by_rows else m * DENSE_COL_COST
        across = m * DENSE_COL_COST if self.by_rows else k * DENSE_ROW_COST
        return min(SAMPLE_STEP * sp.lines_cost(self.sample_lines, 1, along, self.entry),
                   sp.lines_cost(self.sample_cross, SAMPLE_STEP, across, self.entry))

    def sampled_lines(self, s):
        """The lines of 2-D `s` (of s's shape) that the estimate reads: rows 0, SAMPLE_STEP,
        ... of s, or of s^T where s's columns are its lines."""
        return s[::SAMPLE_STEP] if self.by_rows else s[:, ::SAMPLE_STEP].T

    def rejected_early(self) -> bool:
        """Whether `pays` says no before counting all of s and d: the cost besides the lines'
        over the limit, or the estimate from the sampled lines (which alone it reads) over
        SAMPLE_MARGIN times it."""
        limit = SPARSE_MAX_COST * self.s.size - self.overhead
        return limit <= 0 or (len(self.sample_lines) >= 4
                              and self._sample_cost() > SAMPLE_MARGIN * limit)

    def pays(self) -> bool:
        """Whether the sparse path is estimated to cost at most SPARSE_MAX_COST of BLAS, and
        d is finite.
        Costs in BLAS's cost of one element of s: BLAS's is s.size; a line of s costs
        dense_factor times its length on BLAS, entry_cost per non-zero on the sparse path,
        and goes to the cheaper; rows or columns of s are split, whichever costs less (kept
        for `run`)."""
        s = self.s
        m, k = s.shape
        if self.rejected_early():
            return False
        limit = SPARSE_MAX_COST * s.size - self.overhead
        nonfinite = sp.count_nonzeros.for_size(s.size + self.d.size)(
            s, self.row_counts, self.col_counts, self.col_partials, self.by_rows, self.d_scan)
        if nonfinite:            # a skipped 0 * inf would be NaN in BLAS
            return False
        row_cost = sp.lines_cost(self.row_counts, 1, DENSE_ROW_COST * k, self.entry)
        col_cost = sp.lines_cost(self.col_counts, 1, DENSE_COL_COST * m, self.entry)
        self.cost = (min(row_cost, col_cost) + self.overhead) / s.size   # for benchmarks
        if min(row_cost, col_cost) > limit:
            return False
        self.split = "rows" if row_cost <= col_cost else "cols"
        return True

    def run(self) -> None:
        """The product, after `pays` has chosen the split: the dense lines by BLAS, the
        rest from s's CSR (the rows a row split keeps, the columns with a non-zero that a
        column split keeps)."""
        s, d = self.s, self.d
        m, k = s.shape
        if self.dest is None:
            self.dest = np.empty((m, d.shape[1]), self.out.dtype)
        dest = self.dest
        kept_cols = self.col_counts > 0
        if self.split == "rows":
            dense = dense_lines(self.row_counts, k, self.d.shape[1], "rows")
            self.row_counts[dense] = 0
        else:
            dense = dense_lines(self.col_counts, m, self.d.shape[1], "cols")
            kept_cols[dense] = False
        lines = np.flatnonzero(dense)
        cols = np.flatnonzero(kept_cols)
        kept_rows = np.flatnonzero(self.row_counts)
        accumulate = self.split == "cols" and len(lines) > 0
        col_pos = np.full(k, -1, np.int64)
        if d.flags.c_contiguous:
            col_pos[cols] = cols
            d_sparse = d
            d_dense = d[lines] if accumulate else None
        elif self.d_transposed and 2 * (len(cols) + len(lines)) >= k:
            self._scratch()
            self.copy_d()        # all of d copied: faster than half of it gathered
            col_pos[cols] = cols
            d_sparse = self.d_scratch
            d_dense = self.d_scratch[lines] if accumulate else None
        else:                    # d's rows gathered: the sparse part's, then the dense lines'
            col_pos[cols] = np.arange(len(cols))
            rows = np.concatenate([cols, lines]) if accumulate else cols
            gathered = self._scratch()[:len(rows)]
            sp.take_rows.for_size(gathered.size)(d, rows, gathered)
            d_sparse, d_dense = gathered[:len(cols)], gathered[len(cols):]
        # each row's slot in the CSR: its non-zeros (in a column split all of them, at least
        # its kept ones: _fill_rows writes where each row's list ends)
        np.cumsum(self.row_counts, out=self.starts[1:])
        nnz = int(self.starts[-1])
        indices, values = np.empty(nnz, np.int64), np.empty(nnz, s.dtype)
        args = (s, kept_rows, col_pos, cols, self.starts, self.ends, indices, values, d_sparse,
                dest, self.cursor, self.block, accumulate, self.by_rows)
        parts = min(threads.parts(), m)
        if parts == 1:
            dense_part = self._dense_part(lines, d_dense, accumulate)
            if accumulate:
                dense_part(0, m)
            sp.compress_multiply.for_size(self.work)(*args, numba.get_num_threads())
            if not accumulate:
                dense_part(0, m)
            if self.transposed:
                layout.transpose_into(dest, self.out, 0)
        else:                    # row ranges on the engine's threads, one hand-over
            bounds = sp.chunk_rows(self.starts, parts)
            dense_part = self._dense_part(lines, d_dense, accumulate, parallel=False)

            def rows(c):
                r0, r1 = int(bounds[c]), int(bounds[c + 1])
                if accumulate:
                    dense_part(r0, r1)
                sp.compress_multiply_rows(*args, r0, r1)
                if not accumulate:
                    dense_part(r0, r1)
                if self.transposed and r1 > r0:      # out's columns [r0, r1), still cached
                    layout.transpose_into(dest[r0:r1], self.out, r0)
            threads.side_by_side([functools.partial(rows, c) for c in range(parts)])()


def _sparse_sides(out, a, b) -> tuple[bool, bool]:
    """Whether the shapes and layouts of out = a @ b allow the sparse path with s = a
    (left) and with s = b^T (right)."""
    if (a.ndim != 2 or b.ndim != 2 or not out.flags.c_contiguous
            or out.dtype not in (np.float32, np.float64) or not a.dtype == b.dtype == out.dtype):
        return False, False
    (m, k), n = a.shape, b.shape[1]
    if m * k * n < SPARSE_MIN_MACS:
        return False, False
    return n >= SPARSE_MIN_ROW, m >= SPARSE_MIN_ROW


def sparse_products(out, a, b) -> list[SparseProduct]:
    """The sparse products that the shapes and layouts of out = a @ b allow, in the order
    they are tried: s = a (left), then s = b^T (right); none in plain mode."""
    if paths.PLAIN:
        return []
    left, right = _sparse_sides(out, a, b)
    products = []
    if left:
        products.append(SparseProduct(a, b, out))
    if right:
        products.append(SparseProduct(b.T, a.T, out, transposed=True))
    return products


def choose_product(products) -> SparseProduct | None:
    """The first product that pays, else None (BLAS). Reads the data: call it at each
    run."""
    for p in products:
        if p.pays():
            return p
    return None


def matmul_path(out, a, b) -> str:
    """The path cpu_matmul takes for these arrays now: "blas", or "sparse_left" or
    "sparse_right" followed by the split ("/rows" or "/cols", with "+blas" when some lines
    of s go to BLAS); for tests and benchmarks."""
    p = choose_product(sparse_products(out, a, b))
    return "blas" if p is None else path_name(p)


def path_name(p: SparseProduct) -> str:
    """The name of sparse product `p`'s path, once `pays` has chosen its split (see
    matmul_path)."""
    m, k = p.s.shape
    counts, length = (p.row_counts, k) if p.split == "rows" else (p.col_counts, m)
    side = "sparse_right" if p.transposed else "sparse_left"
    dense = dense_lines(counts, length, p.d.shape[1], p.split)
    return f"{side}/{p.split}" + ("+blas" if dense.any() else "")


def matmul_chunks(out, ins, parts):
    """How a product is split across the engine's threads (engine.backends.cpu.threads):
    batched products along the first batch axis; a matrix product as matrix_chunks. A
    product that may take the sparse path is not split here: its run splits its own parts
    (SparseProduct.run, or blas_product when it goes to BLAS)."""
    a, b = ins
    if out.size * a.shape[-1] < threads.MIN_MACS:
        return None
    if out.ndim > 2:
        return threads.along_axis0(out, ins, parts) if out.shape[0] > 1 else None
    if any(_sparse_sides(out, a, b)):
        return None
    return matrix_chunks(out, a, b, parts)


def matrix_chunks(out, a, b, parts):
    """A matrix product out = a @ b as products on ranges of out's rows (a's rows), or of
    its columns (b's) when it has fewer rows than `parts`; None when neither splits."""
    m, n = out.shape
    if m >= parts:
        return [(out[lo:hi], [a[lo:hi], b]) for lo, hi in threads.bounds(m, parts)]
    if n >= parts:
        return [(out[:, lo:hi], [a, b[:, lo:hi]]) for lo, hi in threads.bounds(n, parts)]
    return None


def blas_product(a, b, out) -> None:
    """out = a @ b by BLAS (2-D), split across the engine's threads where that pays (BLAS
    itself runs one thread while a plan runs)."""
    parts = threads.parts()
    pieces = (matrix_chunks(out, a, b, parts)
              if parts > 1 and out.size * a.shape[1] >= threads.MIN_MACS else None)
    if pieces:
        paths.taken("matmul:blas_chunks")
        threads.side_by_side([functools.partial(np.matmul, ca, cb, out=o)
                              for o, (ca, cb) in pieces])()
    else:
        np.matmul(a, b, out=out)


class _Shared:
    """The widening of an operand that every chunk of a product reads whole, as ranges of
    its memory block's rows: each chunk `take`s the ranges that no chunk has taken yet (its
    own first) and widens them, then `wait`s for those the others took. Chunks run one after
    another (the pool busy with another plan) never wait: the first takes them all."""

    def __init__(self, dst, a, parts):
        self.dst, self.a = dst, a
        blocks = half.memory_blocks(a, dst)
        self.ranges = [None] if blocks is None else threads.bounds(blocks[0].shape[0], parts)
        self.block16, self.block32 = blocks or (None, None)
        # a range is taken by whoever acquires its claim first; its `done` lock, held from
        # here, is released when it is widened (plain locks: cheaper to make than Events)
        self.claims = [threading.Lock() for _ in self.ranges]
        self.done = [threading.Lock() for _ in self.ranges]
        for d in self.done:
            d.acquire()
        self.failed = False

    def take(self, first: int) -> None:
        n = len(self.ranges)
        for j in [(first + i) % n for i in range(n)]:
            if not self.claims[j].acquire(blocking=False):
                continue
            try:
                if self.ranges[j] is None:
                    half.widen_into(self.dst, self.a)
                else:
                    lo, hi = self.ranges[j]
                    half.widen_into(self.block32[lo:hi], self.block16[lo:hi])
            except BaseException:
                self.failed = True
                raise
            finally:
                self.done[j].release()

    def wait(self) -> bool:
        """Whether every range was widened (False: a chunk's widening raised)."""
        for d in self.done:
            d.acquire()
            d.release()
        return not self.failed


def bind_widened(out, ins):
    """A 16-bit product out = a @ b (2-D, all three 16-bit) with its conversions inside
    BLAS's chunks (the fast path widen:fused): run(scratch), its float32 temporaries from
    half.Scratch; None where it does not apply (one thread, plain mode, batched or mixed
    products, products that blas_product does not split by rows).
    Each chunk, a range of out's rows, widens its rows of a (a C-contiguous a), computes
    its rows of the product by the BLAS call blas_product makes for them, and rounds them
    into out at once, while they are in its cache (half.store); an operand that every
    chunk reads whole (b, and a transposed a) is widened before the product, in ranges on
    the engine's threads (half.widen_into, split), where it has SPLIT_MIN_ELEMENTS or more,
    else in the chunks' own hand-over (_Shared: each chunk widens a part, then waits for
    the others'). The zero-skipping product's choice reads the operands: where both
    products' estimates from their sampled lines (widened first) say BLAS, the chunks run;
    else everything is widened and the choice made as cpu_matmul makes it. The same BLAS
    calls on the same values, exact widening and elementwise rounding: the bits of the
    widened float32 kernel at the same thread count."""
    a, b = ins
    parts = threads.parts()
    if (parts < 2 or out.ndim != 2 or a.ndim != 2 or b.ndim != 2
            or not out.flags.c_contiguous
            or not (is_half(out.dtype) and is_half(a.dtype) and is_half(b.dtype))
            or out.shape[0] < parts or out.size * a.shape[1] < threads.MIN_MACS
            or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        return None
    paths.taken("widen:fused")
    rows = threads.bounds(out.shape[0], parts)
    a_rows = a.flags.c_contiguous
    a_before = not a_rows and a.size >= half.SPLIT_MIN_ELEMENTS
    b_before = b.size >= half.SPLIT_MIN_ELEMENTS
    last = []            # [(the temporaries' addresses and strides, their sparse products)]

    def run(scratch):
        wide_out = scratch.empty(out.shape)
        wide_a, wide_b = (half.widened_like(x, scratch.empty) for x in (a, b))
        a_ready, b_ready = a_before, b_before
        if a_before:
            half.widen_into(wide_a, a, split=True)
        if b_before:
            half.widen_into(wide_b, b, split=True)
        key = tuple((x.ctypes.data, x.strides) for x in (wide_out, wide_a, wide_b))
        if not last or last[0][0] != key:
            products = sparse_products(wide_out, wide_a, wide_b)
            # each product's sampled lines, float32 and 16-bit, where not widened before
            samples = [(p.sampled_lines(p.s), p.sampled_lines(b.T if p.transposed else a))
                       for p in products if not (b_before if p.transposed else a_before)]
            last[:] = [(key, products, samples)]
        _, products, samples = last[0]
        if products:
            for wide_lines, lines in samples:
                half.widen_into(wide_lines, lines)
            if not all(p.rejected_early() for p in products):
                if not a_ready:
                    half.widen_into(wide_a, a, split=True)
                if not b_ready:
                    half.widen_into(wide_b, b, split=True)
                a_ready = b_ready = True
                p = choose_product(products)
                if p is not None:
                    paths.taken(f"matmul:{path_name(p)}")
                    p.run()
                    half.split_store(out, wide_out)
                    return
        shared = [_Shared(w, x, parts) for w, x, ready in
                  ((wide_a, a, a_ready or a_rows), (wide_b, b, b_ready)) if not ready]
        own_rows = a_rows and not a_ready
        paths.taken("matmul:blas_chunks")

        def chunk(c):
            lo, hi = rows[c]
            for sh in shared:
                sh.take(c)
            if own_rows:
                half.widen_into(wide_a[lo:hi], a[lo:hi])
            for sh in shared:
                if not sh.wait():
                    return           # another chunk's widening raised: the pool raises it
            np.matmul(wide_a[lo:hi], wide_b, out=wide_out[lo:hi])
            half.store(out[lo:hi], wide_out[lo:hi])
        threads.side_by_side([functools.partial(chunk, c) for c in range(len(rows))])()
    return run


@half.widens_on_threads
@functools.partial(threads.split, chunks=matmul_chunks)
@bindable
def cpu_matmul(out, ins):
    """Dispatcher of matmul: kernel(out, [a, b]). A 16-bit node's operands are widened to
    float32 and its output rounded (half.widened) on the engine's threads: only BLAS's
    chunks were split, and at 2 threads the serial conversions made a bfloat16 product
    1.31 times the float32 one (python bench/bench_ops.py --op matmul, quiet, 45d1d98).
    A 2-D 16-bit product that BLAS's chunks split by rows converts inside them
    (bind_widened, the path widen:fused): below half.SPLIT_MIN_ELEMENTS the conversions
    still ran on the calling thread while the other core waited, and the rounding read the
    output back after it had left the cache: the calling thread's CPU per bfloat16 call of
    bench_half's 512x768 @ 768x512 over the float32 product's, forward 1.23-1.26 against
    main's 1.31-1.44, backward 1.25-1.26 against 1.37-1.43 (docs/performance.md, "16-bit
    kernels", issue 37's seventh round)."""
    a, b = ins
    products = sparse_products(out, a, b)
    if not products:
        return lambda: np.matmul(a, b, out=out)

    def run():
        p = choose_product(products)
        if p is None:
            blas_product(a, b, out)
        else:
            paths.taken(f"matmul:{path_name(p)}")
            p.run()
    return run


cpu_matmul.bind_widened = bind_widened
