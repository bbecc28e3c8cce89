"""gradcheck against torch.autograd.gradcheck on the same cases, measured alike, in one run.

    python bench/bench_gradcheck.py            # or: tox -e bench -- (see tox.ini)
    python bench/bench_gradcheck.py --quick    # the fast tier's two ratios only

Two ways, each alike for both tools:
- whole processes: `gradcheck --all --no-progress` against bench/torch_gradcheck_sweep.py
  (torch.autograd.gradcheck over the cases of --all that torch has, in a fresh process of
  its own), both started by this script and timed as wall clock, imports and start-up
  included, each after a warm-up run (numba's cache warm). Ours checks more cases (those
  torch lacks: dedicated backward ops, ops without a torch twin): the ratio favours torch;
- in-process: gradcheck.runner.run_checks over exactly the cases torch checks, against
  the time inside torch.autograd.gradcheck's calls on them, in this process, after a
  warm-up of both.
The machine is noisy: each figure is the best of ROUNDS runs, ours and torch's
alternating. Then, as whole processes: the scale tier over every op (`--tier scale`) and
`--all --random 200` (generated cases, hypothesis' shrinking included).

Targets: the fast tier at most 0.6 of torch's time in-process and 0.8 as whole processes;
the scale tier under 3 minutes; `--all --random 200` under 2 minutes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch_gradcheck_sweep as torch_sweep  # noqa: E402

from gradcheck.runner import run_checks  # noqa: E402

ROUNDS = 3
TARGETS = {"in_process": 0.6, "whole_process": 0.8, "scale_s": 180.0, "random_s": 120.0}
GRADCHECK = [sys.executable, "-m", "gradcheck.cli", "--no-progress"]
TORCH_SWEEP = [sys.executable, torch_sweep.__file__]


def wall(cmd) -> tuple[float, str]:
    """(seconds, last line of stdout) of one run of `cmd`."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    return seconds, f"exit {proc.returncode}: {lines[-1] if lines else proc.stderr[-200:]}"


def whole_process(rounds: int) -> tuple[float, float]:
    """Best wall clock of `gradcheck --all` and of the torch sweep, alternating."""
    ours_cmd = GRADCHECK + ["--all"]
    wall(ours_cmd)                                   # warm-up: numba's cache
    wall(TORCH_SWEEP)
    ours, theirs = [], []
    for _ in range(rounds):
        s, line = wall(ours_cmd)
        ours.append(s)
        t, tline = wall(TORCH_SWEEP)
        theirs.append(t)
        print(f"  whole process: gradcheck --all {s:.1f} s ({line}); "
              f"torch sweep {t:.1f} s ({tline})", flush=True)
    return min(ours), min(theirs)


def in_process(rounds: int) -> tuple[float, float, int]:
    """Best in-process seconds of our checks and of torch's on the same cases."""
    cases = list(torch_sweep.torch_cases())
    run_checks(cases)                                # warm-up: compiled kernels, caches
    torch_sweep.sweep(cases)
    ours, theirs = [], []
    n = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        results = run_checks(cases)
        ours.append(time.perf_counter() - t0)
        seconds, n, failed = torch_sweep.sweep(cases)
        theirs.append(seconds)
        bad = sum(r.status not in ("pass", "skip") for r in results)
        print(f"  in-process: ours {ours[-1]:.1f} s ({bad} not passing) on {len(cases)} "
              f"cases; torch {seconds:.1f} s on {n} ({failed} reported failures)", flush=True)
    return min(ours), min(theirs), n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="the fast tier's ratios only (no scale tier, no --random 200)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help=f"runs of each (default {ROUNDS})")
    args = p.parse_args(argv)
    ours_ip, torch_ip, n = in_process(args.rounds)
    ours_wp, torch_wp = whole_process(args.rounds)
    ratios = {"in_process": ours_ip / torch_ip, "whole_process": ours_wp / torch_wp}
    print(f"in-process on the same {n} cases: ours {ours_ip:.1f} s, torch.autograd.gradcheck "
          f"{torch_ip:.1f} s: ratio {ratios['in_process']:.2f} "
          f"(target <= {TARGETS['in_process']})")
    print(f"whole processes: gradcheck --all {ours_wp:.1f} s, torch sweep {torch_wp:.1f} s: "
          f"ratio {ratios['whole_process']:.2f} (target <= {TARGETS['whole_process']})")
    ok = all(ratios[k] <= TARGETS[k] for k in ratios)
    if not args.quick:
        scale_s, line = wall(GRADCHECK + ["--all", "--tier", "scale"])
        print(f"gradcheck --all --tier scale: {scale_s:.1f} s ({line}) "
              f"(target < {TARGETS['scale_s']:.0f} s)")
        random_s, line = wall(GRADCHECK + ["--all", "--random", "200"])
        print(f"gradcheck --all --random 200: {random_s:.1f} s ({line}) "
              f"(target < {TARGETS['random_s']:.0f} s)")
        ok = ok and scale_s < TARGETS["scale_s"] and random_s < TARGETS["random_s"]
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
