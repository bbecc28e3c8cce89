"""What forward mode and second order cost: `gradcheck --all --ad both` against `--ad rev`,
per engine, measured alike in one run; and the adapters' whole `--all` runs.

    python bench/bench_derivatives.py                       # ours, torch, jax (installed)
    python bench/bench_derivatives.py --engine torch --rounds 1
    python bench/bench_derivatives.py --adapters            # also jax's and tinygrad's --all
    python bench/bench_derivatives.py --order2              # also --order 2, for information
    python bench/bench_derivatives.py --engine none --cold  # only jax's and tinygrad's cold --all

Each figure is the wall clock of a whole process (`gradcheck --engine NAME --all
--no-progress --ad MODE`, imports and start-up included), the best of ROUNDS runs after a
warm-up run of each (numba's and jax's compile caches warm), the modes alternating so that
the machine's noise falls on both. With --order2, `--order 2` (reverse mode and the
Hessian-vector products) is timed the same way and printed beside them, for information.
The rows each run gave are printed: a failing row is a finding, not a benchmark failure.

With --cold, each adapter's whole `--all` run is timed once more from cold: its engine's
kernel cache (tinygrad's CACHEDB, jax's JAX_COMPILATION_CACHE_DIR) pointed at an empty
directory, with `--workers COLD_WORKERS` (default 2, the advice for a first run); our own
engine's compiled kernels (the float64 reference) stay warm: their first run is the tools'
own, not the adapter's.

Targets: `--ad both` at most 1.5x `--ad rev` for every engine timed; with --adapters and
--cold, `gradcheck --engine jax --all` and `--engine tinygrad --all` (reverse mode, warm and
cold) under 10 minutes each. The script exits 1 when one is missed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

from tabulate import tabulate

ROUNDS = 2
BOTH_TARGET = 1.5          # --ad both / --ad rev, at most
ADAPTER_TARGET = 600.0     # seconds of a whole --all run of an adapter, at most
ENGINES = ("engine", "torch", "jax")
NEEDS = {"torch": "torch", "jax": "jax", "tinygrad": "tinygrad"}
ADAPTERS = ("jax", "tinygrad")
COLD_CACHE = {"jax": "JAX_COMPILATION_CACHE_DIR", "tinygrad": "CACHEDB"}
COLD_WORKERS = 2
MODES = {"rev": ["--ad", "rev"], "both": ["--ad", "both"], "order 2": ["--order", "2"]}


def installed(engine: str) -> bool:
    return engine not in NEEDS or importlib.util.find_spec(NEEDS[engine]) is not None


def run_once(engine: str, extra: list[str], cold: bool = False) -> tuple[float, dict]:
    """(seconds, rows by status) of one whole `gradcheck --engine ENGINE --all` run; cold:
    with the engine's kernel cache in an empty directory (see the module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "gradcheck.cli", "--engine", engine, "--all",
               "--no-progress", "--format", "json", "--output", out, *extra]
        env = dict(os.environ)
        if cold:
            cache = os.path.join(tmp, "cache")
            os.mkdir(cache)
            env[COLD_CACHE[engine]] = (os.path.join(cache, "cache.db")
                                       if engine == "tinygrad" else cache)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: "
                             f"{proc.stderr.strip()[-300:]}")
        with open(out, encoding="utf-8") as f:
            rows = json.load(f)["results"]
    counts: dict = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return seconds, counts


def _counts(counts: dict) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", choices=(*ENGINES, "none"),
                        help="the engines whose modes to time (default: every one "
                             "installed; none: no engine's)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--order2", action="store_true",
                        help="also time --order 2 (for information; no target)")
    parser.add_argument("--adapters", action="store_true",
                        help="also time jax's and tinygrad's whole --all runs (minutes)")
    parser.add_argument("--cold", action="store_true",
                        help="also time jax's and tinygrad's --all runs from cold (many "
                             "minutes)")
    parser.add_argument("--cold-workers", type=int, default=COLD_WORKERS,
                        help="--workers of the cold runs (default %(default)s)")
    args = parser.parse_args(argv)
    if args.cold_workers < 1:
        parser.error(f"--cold-workers must be at least 1, got {args.cold_workers}")
    engines = [e for e in (args.engine or ENGINES) if e != "none" and installed(e)]
    modes = {m: extra for m, extra in MODES.items() if m != "order 2" or args.order2}
    missed, table = [], []
    for engine in engines:
        for mode in modes.values():                 # warm-up: compile caches, imports
            run_once(engine, mode)
        best = {m: float("inf") for m in modes}
        counts = {}
        for _ in range(args.rounds):
            for mode, extra in modes.items():
                seconds, counts[mode] = run_once(engine, extra)
                best[mode] = min(best[mode], seconds)
        ratio = best["both"] / best["rev"]
        ok = ratio <= BOTH_TARGET
        missed += [] if ok else [f"{engine} --ad both"]
        for mode in modes:
            shown = (f"{ratio:.2f} (target {BOTH_TARGET:g}, {'met' if ok else 'MISSED'})"
                     if mode == "both" else
                     f"{best[mode] / best['rev']:.2f}" if mode != "rev" else "1")
            table.append([engine, mode, f"{best[mode]:.1f}", shown, _counts(counts[mode])])
    if table:
        print(tabulate(table, headers=["engine", "mode", "seconds", "x rev", "rows"]))
    runs = ([("warm", [], False)] if args.adapters else []) + (
        [(f"cold, --workers {args.cold_workers}", ["--workers", str(args.cold_workers)],
          True)] if args.cold else [])
    if runs:
        rows = []
        for engine in ADAPTERS:
            if not installed(engine):
                rows.append([engine, "", "not installed", "", ""])
                continue
            for how, extra, cold in runs:
                if not cold:
                    run_once(engine, extra)            # warm-up
                seconds, counts = run_once(engine, extra, cold)
                ok = seconds <= ADAPTER_TARGET
                missed += [] if ok else [f"{engine} --all ({how})"]
                rows.append([engine, how, f"{seconds:.1f}",
                             f"{ADAPTER_TARGET:g} ({'met' if ok else 'MISSED'})",
                             _counts(counts)])
        print()
        print(tabulate(rows, headers=["--all, reverse mode", "caches", "seconds", "target",
                                      "rows"]))
    if missed:
        print(f"\nmissed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
