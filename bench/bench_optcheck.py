"""optcheck's run times: our engine's full run, each optimizer adapter's, and the diagnosis.

    python bench/bench_optcheck.py                 # every adapter that is installed
    python bench/bench_optcheck.py --engine torch --engine ggml

Each figure is the wall clock of a whole process, `optcheck --engine NAME --opt all
--no-progress` (imports, start-up and worker processes included), the best of ROUNDS runs
after a warm-up run (numba's compile cache warm), the engines alternating so that the
machine's noise falls on all alike. The rows each run gave (passed, failed, unsupported,
...) are printed beside its time; a failing row is a finding, not a benchmark failure.
The diagnosis (optcheck.diagnosis) is timed in this process: the seconds one call takes
to name the variant of a diverging AdamW trajectory (4 tensors, 100 steps), best of
ROUNDS.

Targets: ours under 20 s warm, each adapter under 60 s, the diagnosis under 1 s per
diverging row; the script exits 1 when one is missed. Our engine's time over torch.optim's
for-loop adapter's, measured in the same run, is printed as the ratio to read on a noisy
machine.
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
TARGETS = {"engine": 20.0}
ADAPTER_TARGET = 60.0
DIAGNOSIS_TARGET = 1.0
ENGINES = ("engine", "torch", "torch-foreach", "torch-fused", "ggml", "optax")
NEEDS = {"ggml": "libggml", "optax": "optax", "torch": "torch", "torch-foreach": "torch",
         "torch-fused": "torch"}


def run_once(engine: str) -> tuple[float, dict, int]:
    """(seconds, rows by status, exit status) of one whole optcheck run of `engine`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        cmd = [sys.executable, "-m", "optcheck.cli", "--engine", engine, "--opt", "all",
               "--no-progress", "--format", "json", "--output", out]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: "
                             f"{proc.stderr.strip()[-300:]}")
        with open(out, encoding="utf-8") as f:
            rows = json.load(f)["results"]
    counts: dict = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return seconds, counts, proc.returncode


def diagnosis_seconds(rounds: int) -> tuple[float, str]:
    """Best seconds of one diagnosis of an AdamW with eps inside the square root, and what
    it said."""
    import numpy as np

    from optcheck.adapters.numpy_adapter import NumpyUpdate
    from optcheck.diagnosis import diagnose
    from optcheck.reference import Trace, follow
    from optcheck.torch_trajectories import scenarios

    def init(params):
        return {k: {"exp_avg": np.zeros_like(p), "exp_avg_sq": np.zeros_like(p)}
                for k, p in params.items()}

    def update(params, grads, state, step, hp):
        (b1, b2), out, new = hp["betas"], {}, {}
        for k, p in params.items():
            m = b1 * state[k]["exp_avg"] + (1 - b1) * grads[k]
            v = b2 * state[k]["exp_avg_sq"] + (1 - b2) * grads[k] ** 2
            denom = np.sqrt(v / (1 - b2 ** step) + hp["eps"])
            out[k] = p * (1 - hp["lr"] * hp["weight_decay"]) - \
                hp["lr"] * m / (1 - b1 ** step) / denom
            new[k] = {"exp_avg": m, "exp_avg_sq": v}
        return out, new

    scenario = next(s for s in scenarios("adamw", 100) if s.hp["eps"] >= 0.1
                    and s.schedule is None and not any(s.flags.values()))
    trace = Trace()
    follow(NumpyUpdate(init, update, "adamw"), "adamw", scenario, "f64", 100, 0, trace)
    best, said = float("inf"), ""
    for _ in range(rounds):
        t0 = time.perf_counter()
        found = diagnose("adamw", scenario.hp, scenario.flags, "f64", trace.init,
                         trace.grads, trace.observed)
        best = min(best, time.perf_counter() - t0)
        said = found.message
    return best, said


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", choices=ENGINES,
                        help="the engines to time (default: every one installed)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    engines = args.engine or [e for e in ENGINES
                              if e not in NEEDS or importlib.util.find_spec(NEEDS[e])]
    for engine in engines:                        # warm-up: numba's cache, imports
        run_once(engine)
    best = {e: float("inf") for e in engines}
    counts = {}
    for _ in range(args.rounds):
        for engine in engines:
            seconds, counts[engine], _ = run_once(engine)
            best[engine] = min(best[engine], seconds)
    table, missed = [], []
    for engine in engines:
        target = TARGETS.get(engine, ADAPTER_TARGET)
        ok = best[engine] <= target
        missed += [] if ok else [engine]
        table.append([engine, f"{best[engine]:.1f}", f"{target:g}", "met" if ok else "MISSED",
                      ", ".join(f"{n} {s}" for s, n in sorted(counts[engine].items()))])
    print(tabulate(table, headers=["engine", "seconds", "target", "", "rows"]))
    if "engine" in best and "torch" in best:
        print(f"\nours / torch.optim's for-loop adapter: {best['engine'] / best['torch']:.2f}")
    seconds, said = diagnosis_seconds(args.rounds)
    ok = seconds <= DIAGNOSIS_TARGET
    missed += [] if ok else ["diagnosis"]
    print(f"\ndiagnosis of one diverging row: {seconds:.3f} s (target {DIAGNOSIS_TARGET:g} s, "
          f"{'met' if ok else 'MISSED'}): {said}")
    if missed:
        print(f"\nmissed: {', '.join(missed)}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
