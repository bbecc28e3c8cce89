"""CPU kernels of matmul's sparse path: out = s @ d skipping the exact zeros of s.

    out[i, :] = sum over k with s[i, k] != 0 of s[i, k] * d[k, :]

s (m x k) is any 2-D view; d (k x n) and out (m x n) are C-contiguous (engine.backends.cpu.
matmul gathers or copies d when d is not, and sends dense lines of s to BLAS). Steps:
- count (`sample_counts` on every step-th line for a cheap estimate, then
  `count_nonzeros`, rows and columns, and d's NaNs and infinities);
- compress (`_fill_rows`): the kept rows of s as CSR, (column, value) lists in column
  order, row i's list written from starts[i] (its slot, sized by the row's non-zeros, or
  by more: a caller that drops columns sizes slots by all of a row's non-zeros and need
  not count the kept ones) up to ends[i], each thread its own chunk of rows, which it then
- multiplies (`compress_multiply`): per row of out, contiguous row updates
      out[i, :] += v1 * d[k1, :] + ... + v8 * d[k8, :]
  eight list entries at a time (then four, two, one), summed as the tree
  ((p1 + p2) + (p3 + p4)) + ((p5 + p6) + (p7 + p8)), so out's row is read and written once
  per eight entries; the entries are taken in column blocks of `block` rows of d (a block of
  d stays in a core's L2 cache while every row of that thread's chunk uses it).

Rows are split among threads into one chunk per thread (compress_multiply: of about equal
work, entries plus rows), starting at multiples of LINE_ROWS rows; each thread writes only its
own rows and its own partial counts, so no two threads write to one cache line. The
terms skipped are s's zeros times d's values, exact zeros when d is finite (callers check
d with `count_nonzeros`), so the result differs from a dense product only in the order of
the additions (and, for a zero result, perhaps its sign). A row of s with no non-zero (or
one left out) gives a zero row, or leaves out's row as it was when accumulating.
"""

from __future__ import annotations

import numpy as np

from engine.backends.cpu.jit import kernel, parallel_kernel, prange

LINE_ROWS = 16   # chunk boundaries at multiples of 16 rows: threads share no cache line


@kernel
def chunk_start(c, nchunks, m):
    """The first row of chunk c of nchunks over m rows (c = nchunks: m), a multiple of
    LINE_ROWS unless 0 or m."""
    if c >= nchunks:
        return m
    return min(m, (c * m // nchunks + LINE_ROWS - 1) // LINE_ROWS * LINE_ROWS)


@kernel
def count_line(line, cross):
    """The non-zeros of the 1-D view `line`; cross[j] += 1 where line[j] is one."""
    n = 0
    for j in range(line.shape[0]):
        nz = line[j] != 0
        n += nz
        cross[j] += nz
    return n


@kernel
def sample_counts(s, step, by_rows, line_counts, cross_counts):
    """Non-zeros in every step-th line of s along its contiguous axis (rows 0, step, ... if
    by_rows, else columns): line_counts[q] = those of sampled line q, cross_counts[j] =
    those at position j across the sampled lines."""
    cross_counts[:] = 0
    for q in range(line_counts.shape[0]):
        if by_rows:
            line_counts[q] = count_line(s[q * step], cross_counts)
        else:
            line_counts[q] = count_line(s[:, q * step], cross_counts)


@parallel_kernel
def count_nonzeros(s, row_counts, col_counts, col_partials, by_rows, d):
    """row_counts[i], col_counts[k] = the non-zeros of row i, column k of s (through
    col_partials[c, k], those of column k in row chunk c, one chunk per thread; a row of
    col_partials may be longer than k: padding). by_rows: s's rows are its contiguous
    lines (else its columns are: each thread then reads its part of every column).
    Returns the number of NaNs and infinities in d (any 2-D array; v - v is 0 exactly when
    v is finite), counted in the same threads."""
    m, kdim = s.shape
    nchunks = col_partials.shape[0]
    bad = 0
    for c in prange(nchunks):
        r0 = chunk_start(c, nchunks, m)
        r1 = chunk_start(c + 1, nchunks, m)
        for i in range(c * d.shape[0] // nchunks, (c + 1) * d.shape[0] // nchunks):
            drow = d[i]
            for j in range(d.shape[1]):
                v = drow[j]
                bad += (v - v) != 0
        cnt = row_counts[r0:r1]
        cols = col_partials[c, :kdim]
        cols[:] = 0
        if by_rows:
            for i in range(r1 - r0):
                cnt[i] = count_line(s[r0 + i], cols)
        else:
            cnt[:] = 0
            for k in range(kdim):
                cols[k] = count_line(s[r0:r1, k], cnt)
    col_counts[:] = 0
    for c in range(nchunks):
        for k in range(kdim):
            col_counts[k] += col_partials[c, k]
    return bad


@kernel
def lines_cost(counts, scale, length, entry_cost):
    """sum over lines of min(length, entry_cost * scale * counts[q]): each line of s on
    the cheaper path (BLAS: its length; sparse: entry_cost per non-zero)."""
    total = 0.0
    for q in range(counts.shape[0]):
        total += min(float(length), entry_cost * scale * counts[q])
    return total


@kernel
def _fill_rows(s, r0, r1, rows, col_pos, cols, starts, ends, indices, values, by_rows):
    """The non-zeros of the kept rows i of s in [r0, r1) (`rows`: those i, ascending) in
    the kept columns k (`cols`: those k, ascending; col_pos[k] >= 0), in column order, as
    (col_pos[k], s[i, k]) into indices/values[starts[i]:ends[i]] (ends[i] written here for
    every row in [r0, r1): starts[i] for a row not kept). s is read at the kept rows and
    columns only: where most non-zeros are in dense lines (left out, to BLAS) the test for
    a non-zero then mostly fails, which the CPU predicts (MNIST's FC products: 2.7 and 1.5
    times faster than reading every element)."""
    ends[r0:r1] = starts[r0:r1]
    mine = rows[np.searchsorted(rows, r0):np.searchsorted(rows, r1)]
    if by_rows:
        for i in mine:
            p = starts[i]
            row = s[i]
            for t in range(cols.shape[0]):
                k = cols[t]
                v = row[k]
                if v != 0:
                    indices[p] = col_pos[k]
                    values[p] = v
                    p += 1
            ends[i] = p
    else:
        for t in range(cols.shape[0]):     # s's columns are its contiguous lines
            k = cols[t]
            q = col_pos[k]
            col = s[:, k]
            for i in mine:
                v = col[i]
                if v != 0:
                    p = ends[i]
                    indices[p] = q
                    values[p] = v
                    ends[i] = p + 1


@parallel_kernel
def take_columns(src, cols, dst):
    """dst[i, q] = src[i, cols[q]] (a gather of columns; dst C-contiguous)."""
    m = dst.shape[0]
    nq = cols.shape[0]
    for i in prange(m):
        row = dst[i]
        for q in range(nq):
            row[q] = src[i, cols[q]]


@parallel_kernel
def take_rows(src, rows, dst):
    """dst[q, :] = src[rows[q], :] (a gather of rows; dst C-contiguous, src any strides:
    a transposed src is read in 64-column blocks, so that each cache line read serves
    consecutive rows)."""
    nq, n = dst.shape
    for q0 in prange((nq + 63) // 64):
        for j0 in range(0, n, 64):
            for q in range(q0 * 64, min(q0 * 64 + 64, nq)):
                r = rows[q]
                for j in range(j0, min(j0 + 64, n)):
                    dst[q, j] = src[r, j]


@kernel
def _balanced_row(starts, target):
    """The first row i with starts[i] + i >= target (entries plus rows: a row's work),
    rounded up to a multiple of LINE_ROWS (or the last row)."""
    lo = 0
    hi = starts.shape[0] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid] + mid < target:
            lo = mid + 1
        else:
            hi = mid
    return min(starts.shape[0] - 1, (lo + LINE_ROWS - 1) // LINE_ROWS * LINE_ROWS)


@kernel
def _entries4(d, indices, values, p):
    """Entries p to p + 3: their rows of d and their values, (r1, r2, r3, r4, v1, v2, v3,
    v4), for _accumulate's unrolled blocks."""
    return (d[indices[p]], d[indices[p + 1]], d[indices[p + 2]], d[indices[p + 3]],
            values[p], values[p + 1], values[p + 2], values[p + 3])


@kernel
def _accumulate(orow, d, indices, values, p, e):
    """orow += sum over q in [p, e) of values[q] * d[indices[q]], eight entries at a time
    summed as a tree, then four, two, one."""
    n = orow.shape[0]
    while p + 8 <= e:
        r1, r2, r3, r4, v1, v2, v3, v4 = _entries4(d, indices, values, p)
        r5, r6, r7, r8, v5, v6, v7, v8 = _entries4(d, indices, values, p + 4)
        for j in range(n):
            orow[j] += (((v1 * r1[j] + v2 * r2[j]) + (v3 * r3[j] + v4 * r4[j]))
                        + ((v5 * r5[j] + v6 * r6[j]) + (v7 * r7[j] + v8 * r8[j])))
        p += 8
    if p + 4 <= e:
        r1, r2, r3, r4, v1, v2, v3, v4 = _entries4(d, indices, values, p)
        for j in range(n):
            orow[j] += (v1 * r1[j] + v2 * r2[j]) + (v3 * r3[j] + v4 * r4[j])
        p += 4
    if p + 2 <= e:
        r1 = d[indices[p]]
        r2 = d[indices[p + 1]]
        v1 = values[p]
        v2 = values[p + 1]
        for j in range(n):
            orow[j] += v1 * r1[j] + v2 * r2[j]
        p += 2
    if p < e:
        r1 = d[indices[p]]
        v1 = values[p]
        for j in range(n):
            orow[j] += v1 * r1[j]


@kernel
def chunk_rows(starts, nchunks):
    """The row bounds of compress_multiply's nchunks chunks (rows balanced by their
    entries plus one per row, boundaries at multiples of LINE_ROWS): nchunks + 1 of them."""
    m = starts.shape[0] - 1
    total = starts[m] + m
    bounds = np.empty(nchunks + 1, np.int64)
    for c in range(nchunks + 1):
        bounds[c] = _balanced_row(starts, c * total // nchunks)
    return bounds


@kernel
def compress_multiply_rows(s, rows, col_pos, cols, starts, ends, indices, values, d,
                           out, cursor, block, accumulate, by_rows, r0, r1):
    """compress_multiply on rows [r0, r1) only: it writes only those rows of out, ends,
    cursor and those rows' slots of indices and values, so row ranges may run on threads
    of their own."""
    n = out.shape[1]
    kdim = d.shape[0]
    _fill_rows(s, r0, r1, rows, col_pos, cols, starts, ends, indices, values, by_rows)
    for k0 in range(0, max(kdim, 1), block):
        k1 = k0 + block
        for i in range(r0, r1):
            orow = out[i]
            if k0 == 0:
                if not accumulate:
                    for j in range(n):
                        orow[j] = 0
                p = starts[i]
            else:
                p = cursor[i]
            e = p
            end = ends[i]
            while e < end and indices[e] < k1:
                e += 1
            _accumulate(orow, d, indices, values, p, e)
            cursor[i] = e


@parallel_kernel
def compress_multiply(s, rows, col_pos, cols, starts, ends, indices, values, d, out,
                      cursor, block, accumulate, by_rows, nchunks):
    """out = s' @ d (out += s' @ d if accumulate), s' = s's kept rows and columns, d and
    out C-contiguous (d's row col_pos[k] for s's kept column k, cols: those k): each chunk
    of rows (chunk_rows) is compressed (_fill_rows, CSR in slots starts, ends, indices,
    values) and multiplied (compress_multiply_rows), d's rows in blocks of `block`.
    cursor: scratch of m (each row's position in its list)."""
    nchunks = min(nchunks, out.shape[0])
    if nchunks < 1:
        return
    bounds = chunk_rows(starts, nchunks)
    for c in prange(nchunks):
        compress_multiply_rows(s, rows, col_pos, cols, starts, ends, indices, values, d,
                               out, cursor, block, accumulate, by_rows, bounds[c],
                               bounds[c + 1])
