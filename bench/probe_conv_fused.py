"""Probe of the design conv_2d's kernels took in issue 37's sixth round
(engine/backends/cpu/conv_2d.py): each image's columns in a scratch the size of one
image's columns (in L2), against the nodes conv_2d composed before (im2col into an (N, K,
P) buffer, then batched products and col2im over it, its kernels' plain twin now), on one
thread's CPU time (BLAS on one thread too), 3 x 3 windows of stride 1 and padding 1. (Its
channel-range split of dw keeps the bits on these cases only: the engine sums fixed image
ranges instead, see that module.)

    OPENBLAS_NUM_THREADS=1 python bench/probe_conv_fused.py [--repeat 7]

Per image i, with K = C*9 rows of P = H*W columns and w_rows the (O, K) kernel:

    forward   cols_i = im2col(x[i]) in the scratch;  out[i] = w_rows @ cols_i
    weight    cols_i again;  dw^T += cols_i @ g[i]^T  (images in order: BLAS's beta = 1)
    image     s = w_rows^T @ g[i] in the scratch;  dx[i] = col2im(s)

so no (N, K, P) buffer is written or read from memory: the products read their columns
from L2, where the composed products read them cold (about 75 MB for the bench case),
and the weight gradient needs no (N, O, K) batch of products and no sum. The script
checks the bits it relies on: the forward and dx are those of the composed nodes; dw^T
computed in channel ranges (a thread per range) is the same as computed whole, so a
split by channels keeps one order of additions at every thread count; dw itself differs
from the composed order (a sum of per-image products) in its last bits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from tabulate import tabulate

from engine.backends.cpu import im2col as cpu_im2col
from engine.backends.cpu.blas import gemm
from engine.backends.cpu.jit import njit
from engine.backends.cpu.threads import one_blas_thread, set_num_threads

# (N, C, H, W, O): bench_ops's conv_2d case, the MNIST CNN's two layers per physical batch
CASES = {"bench": (64, 32, 32, 32, 64), "mnist2": (500, 8, 14, 14, 16),
         "mnist1": (500, 1, 28, 28, 8)}
GEOMETRY = (1, 1, 1, 1, 1, 1)          # strides, paddings, dilations (rows, columns)


@njit
def _columns(x, i, s):
    """s[(c*3 + ky)*3 + kx, oy*W + ox] = x[i, c, oy - 1 + ky, ox - 1 + kx] (0 outside)."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    for ch in range(c):
        for ky in range(3):
            for kx in range(3):
                dst = s[(ch * 3 + ky) * 3 + kx]
                for oy in range(h):
                    y = oy - 1 + ky
                    base = oy * w
                    if y < 0 or y >= h:
                        for ox in range(w):
                            dst[base + ox] = 0.0
                        continue
                    src = x[i, ch, y]
                    for ox in range(w):
                        xx = ox - 1 + kx
                        dst[base + ox] = src[xx] if 0 <= xx < w else 0.0


@njit
def _add_columns(s, dx, i, acc):
    """dx[i] = col2im(s), each cell's terms in (ky, kx) order in float64 (the engine's)."""
    c, h, w = dx.shape[1], dx.shape[2], dx.shape[3]
    for ch in range(c):
        acc[:, :] = 0.0
        for ky in range(3):
            for kx in range(3):
                src = s[(ch * 3 + ky) * 3 + kx]
                for oy in range(h):
                    y = oy - 1 + ky
                    if y < 0 or y >= h:
                        continue
                    plane_row = acc[y]
                    for ox in range(w):
                        xx = ox - 1 + kx
                        if 0 <= xx < w:
                            plane_row[xx] += src[oy * w + ox]
        for y in range(h):
            for xx in range(w):
                dx[i, ch, y, xx] = acc[y, xx]


@njit
def _forward(x, w_rows, out, s):
    for i in range(x.shape[0]):
        _columns(x, i, s)
        gemm(False, False, w_rows, s, out[i], 0.0)


@njit
def _weight_t(x, g, dw_t, s):
    for i in range(x.shape[0]):
        _columns(x, i, s)
        gemm(False, True, s, g[i], dw_t, 0.0 if i == 0 else 1.0)


@njit
def _image(w_rows, g, dx, s, acc):
    for i in range(g.shape[0]):
        gemm(True, False, w_rows, g[i], s, 0.0)
        _add_columns(s, dx, i, acc)


def _cpu_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.thread_time()
        fn()
        times.append((time.thread_time() - t0) * 1e3)
    return statistics.median(times)


def probe(n, c, h, w, o, repeat):
    """Rows (part, composed ms, fused ms) and the bit checks' (name, passed) of one case."""
    k, p = c * 9, h * w
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    w_rows = rng.standard_normal((o, k)).astype(np.float32)
    g = rng.standard_normal((n, o, p)).astype(np.float32)
    cols = np.empty((n, k, h, w), np.float32)
    flat = cols.reshape(n, k, p)
    out, out_f = np.empty((n, o, p), np.float32), np.empty((n, o, p), np.float32)
    per_image, dw = np.empty((n, o, k), np.float32), np.empty((o, k), np.float32)
    gc = np.empty((n, k, p), np.float32)
    dx, dx_f = np.empty_like(x), np.empty_like(x)
    dw_t = np.empty((k, o), np.float32)
    s, acc = np.empty((k, p), np.float32), np.empty((h, w))

    def im2col():
        cpu_im2col._im2col_rows(x, cols, 3, 3, *GEOMETRY)

    def col2im():
        cpu_im2col._im2col_back_rows(gc.reshape(n, k, h, w), dx, 3, 3, *GEOMETRY)

    def weight():
        np.matmul(g, flat.transpose(0, 2, 1), out=per_image)
        per_image.sum(axis=0, out=dw)

    composed = {"forward": [im2col, lambda: np.matmul(w_rows, flat, out=out)],
                "weight gradient": [weight],
                "image gradient": [lambda: np.matmul(w_rows.T, g, out=gc), col2im]}
    fused = {"forward": lambda: _forward(x, w_rows, out_f, s),
             "weight gradient": lambda: _weight_t(x, g, dw_t, s),
             "image gradient": lambda: _image(w_rows, g, dx_f, s, acc)}
    rows = []
    for part, calls in composed.items():
        ms = sum(_cpu_ms(f, repeat) for f in calls)
        rows.append([part, ms, _cpu_ms(fused[part], repeat)])
    rows.append(["all", sum(r[1] for r in rows), sum(r[2] for r in rows)])

    checks = [("forward: the composed bits", np.array_equal(out, out_f)),
              ("dx: the composed bits", np.array_equal(dx, dx_f))]
    ranges = [(0, c // 2), (c // 2, c)] if c > 1 else [(0, c)]
    pieces = []
    for c0, c1 in ranges:
        piece = np.empty(((c1 - c0) * 9, o), np.float32)
        _weight_t(np.ascontiguousarray(x[:, c0:c1]), g, piece,
                  np.empty(((c1 - c0) * 9, p), np.float32))
        pieces.append(piece)
    checks.append(("dw^T in channel ranges: the whole's bits",
                   np.array_equal(np.concatenate(pieces), dw_t)))
    return rows, checks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), action="append",
                    help="a case to probe (repeatable; default all)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs per figure (median)")
    args = ap.parse_args(argv)
    set_num_threads(1)
    ok = True
    with one_blas_thread():
        for name in args.case or list(CASES):
            n, c, h, w, o = CASES[name]
            rows, checks = probe(n, c, h, w, o, args.repeat)
            print(f"\n{name}: x ({n}, {c}, {h}, {w}), kernel ({o}, {c}, 3, 3), padding 1; "
                  f"one thread's CPU ms, median of {args.repeat}")
            print(tabulate([[r[0], r[1], r[2], r[2] / r[1]] for r in rows],
                           headers=["part", "composed", "per image", "ratio"], floatfmt=".2f"))
            for label, passed in checks:
                print(f"  {label}: {'yes' if passed else 'NO'}")
                ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
