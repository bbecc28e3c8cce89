"""Fit the sparse matmul path's cost model (engine.backends.cpu.matmul) on this machine.

    python bench/fit_sparse_matmul.py                # one thread, CPU time, a few minutes
    python bench/fit_sparse_matmul.py --repeats 15
    python bench/fit_sparse_matmul.py --mnist        # MNIST's FC products, with dense lines

The cost model counts everything in multiply-adds on BLAS, so its constants depend on how
fast this machine's BLAS is against the engine's compiled loops (a CPU whose BLAS uses wider
vectors makes every other cost dearer in BLAS's units). This times, on one thread (the
engine's and BLAS's) by `time.thread_time` (this thread's CPU time: a loaded machine costs
it little), products out = s @ d by the matmul kernel's SparseProduct (forced: SPARSE_MAX_COST
and the dense lines' costs raised, so that every line of s is sparse) and by BLAS
(blas_product), for s of uniformly random zeros at a few densities and sizes (s the left
operand with d C-contiguous, then transposed; s the right operand), and fits by least squares

    sparse time / BLAS's time per multiply-add
        = SPARSE_ENTRY_COST * nnz(s) * n + ENTRY_FIXED_COST * nnz(s) + SCAN_COST * m * k
          + OUT_COST * m * n + CALL_COST (+ GATHER_COST * k * n where d is not C-contiguous)

`--mnist` times MNIST's FC products instead, in the trainer's layouts (x @ W^T and the
weight gradient g^T @ x, x a batch of 500 training images, whose dense lines go to BLAS),
each split as the module chooses, on the sparse path (forced) and on BLAS, beside the
module's estimate (SparseProduct.cost): what DENSE_ROW_COST and DENSE_COL_COST are fitted
to (see the module's comments).

It prints the fitted constants, the module's (the fit of this CPU's kind: matmul.FITS, chosen
by whether numba compiles for AVX-512), and each product's measured and modelled cost over
BLAS's. A calibration, not a benchmark.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import numpy as np

SHAPES = [(1000, 784, 500), (500, 784, 500), (100, 784, 500), (1000, 784, 72),
          (1000, 300, 500), (300, 2000, 400)]
DENSITIES = [0.01, 0.03, 0.06, 0.1]


def cpu_ms(call, repeats: int) -> float:
    """Median milliseconds of this thread's CPU time per call (after two untimed)."""
    call()
    call()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        call()
        times.append(time.thread_time() - t0)
    return float(np.median(times)) * 1e3


def sparse_run(product) -> None:
    """One product on the sparse path: counted (its split chosen), then run."""
    product.pays()
    product.run()


def forced_sparse(mm, product, repeats: int) -> float:
    """CPU ms per call of `product` on the sparse path (SPARSE_MAX_COST raised; its split and
    dense lines as the module chooses), the module's estimate left in product.cost."""
    saved = mm.SPARSE_MAX_COST
    try:
        mm.SPARSE_MAX_COST = 1e9
        assert product.pays()
        return cpu_ms(functools.partial(sparse_run, product), repeats)
    finally:
        mm.SPARSE_MAX_COST = saved


def mnist_products(mm, repeats: int) -> None:
    """MNIST's FC products in the trainer's layouts, three draws of 500 images."""
    from mnist_target.data import load_mnist

    rng = np.random.default_rng(0)
    images = load_mnist().train_images
    w = (rng.standard_normal((500, 784)) * 0.03).astype(np.float32)
    g = (rng.standard_normal((500, 500)) * 1e-3).astype(np.float32)
    print("product        split  model  sparse ms  BLAS ms  sparse/BLAS")
    for _ in range(3):
        x = images[rng.permutation(len(images))[:500]].copy()
        for name, out, a, b, right in [
                ("x @ W^T", np.empty((500, 500), np.float32), x, w.T, False),
                ("g^T @ x", np.empty((500, 784), np.float32), g.T, x, True)]:
            (product,) = [q for q in mm.sparse_products(out, a, b) if q.transposed == right]
            sparse = forced_sparse(mm, product, repeats)
            blas = cpu_ms(functools.partial(mm.blas_product, a, b, out), repeats)
            print(f"{name:14} {product.split:5}  {product.cost:5.2f}  {sparse:9.3f}  "
                  f"{blas:7.3f}  {sparse / blas:11.2f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9, help="timed calls per product")
    p.add_argument("--mnist", action="store_true",
                   help="MNIST's FC products (dense lines included) instead of the fit")
    args = p.parse_args(argv)

    from engine.backends.cpu import matmul as mm
    from engine.backends.cpu.threads import one_blas_thread, set_num_threads

    set_num_threads(1)
    if args.mnist:
        with one_blas_thread():
            mnist_products(mm, args.repeats)
        return 0
    rng = np.random.default_rng(0)
    rows, targets, labels = [], [], []
    with one_blas_thread():
        for layout in ("d", "d^T", "right"):
            for m, k, n in SHAPES:
                d = rng.uniform(-1, 1, (n, k) if layout == "d^T" else (k, n)).astype(
                    np.float32)
                d = d.T if layout == "d^T" else d
                for density in DENSITIES:
                    s = (rng.uniform(-1, 1, (m, k)) * (rng.random((m, k)) < density)
                         ).astype(np.float32)
                    if layout == "right":    # out^T = s @ d through out = d^T @ s^T
                        out = np.empty((n, m), np.float32)
                        a, b = d.T, s.T
                    else:
                        out = np.empty((m, n), np.float32)
                        a, b = s, d
                    # the product whose sparse operand is s (right: the transposed one)
                    (product,) = [q for q in mm.sparse_products(out, a, b)
                                  if q.transposed == (layout == "right")]
                    forced = {"SPARSE_MAX_COST": 1e9, "DENSE_ROW_COST": 1e9,
                              "DENSE_COL_COST": 1e9}
                    saved = {name: getattr(mm, name) for name in forced}
                    try:
                        for name, value in forced.items():
                            setattr(mm, name, value)
                        assert product.pays()
                        sparse = cpu_ms(functools.partial(sparse_run, product), args.repeats)
                    finally:
                        for name, value in saved.items():
                            setattr(mm, name, value)
                    blas = cpu_ms(functools.partial(mm.blas_product, a, b, out), args.repeats)
                    per_mac = blas / (m * k * n)
                    nnz = np.count_nonzero(s)
                    rows.append([nnz * n, nnz, m * k, m * n, 1.0,
                                 k * n if layout == "d^T" else 0.0])
                    targets.append(sparse / per_mac)
                    labels.append((m, k, n, density, layout, blas, sparse))
    x, y = np.array(rows), np.array(targets)
    # relative errors matter (the model compares with BLAS's m k n): weight by 1 / (m k n)
    w = 1.0 / np.array([m * k * n for m, k, n, *_ in labels])
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    names = ["SPARSE_ENTRY_COST", "ENTRY_FIXED_COST", "SCAN_COST", "OUT_COST", "CALL_COST",
             "GATHER_COST"]
    print("fitted:", "  ".join(f"{name} {c:.3g}" for name, c in zip(names, coef, strict=True)))
    module_coef = [getattr(mm, name, 0.0) for name in names]
    print(f"module ({mm.CPU_KIND}'s fit, matmul.FITS):",
          "  ".join(f"{name} {c:.3g}" for name, c in zip(names, module_coef, strict=True)))
    print("m     k    n    density  layout  BLAS ms  sparse ms  sparse/BLAS  model  module's")
    for (m, k, n, density, layout, blas, sparse), xr in zip(labels, x, strict=True):
        macs = m * k * n
        model = xr @ coef / macs
        module = xr @ module_coef / macs
        print(f"{m:<5} {k:<4} {n:<4} {density:<8} {layout:7} "
              f"{blas:7.3f}  {sparse:9.3f}  {sparse / blas:11.2f}  {model:5.2f}  "
              f"{module:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
