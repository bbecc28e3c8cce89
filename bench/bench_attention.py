"""attention and rope on the CPU against torch, forward and backward, in one run (a
benchmark, not a test).

    python bench/bench_attention.py            # or: tox -e bench
    python bench/bench_attention.py --repeat 30
    python bench/bench_attention.py --threads 1     # both on one thread
    python bench/bench_attention.py --part scaling  # only the 1 -> 2 threads gain

attention: causal self-attention of 8 heads, 512 tokens, head size 64, float32 (the issue's
shape; batch 1), and the same with grouped-query attention (2 kv heads); the engine's
attention (attention_fwd, and attention_back from its backward rule) against torch's
scaled_dot_product_attention and its autograd. rope: (512, 8, 64) and a llama-ish
(2048, 32, 128) in float32, mode normal, the engine's rope and rope_back against torch
code written from the formulas (torch has no rope op): angles from the positions, the
pairs rotated, autograd for the backward. Prints the time of each (the fastest of its
timed runs, --statistic median for the median: bench/op_timing.py says why), forward,
backward and their sum, and the ratio engine / torch (target <= 1.5 for each case's
forward + backward). The engine's time is a whole graph evaluation (its plan made
beforehand), so executor overhead counts; the backward graph is the op's backward rule
fed with the forward values and an upstream gradient (as bench_cpu's). The timed runs
come in rounds, engine and torch taking turns, each turn after a pause (torch's workers
keep spinning a while after its calls) and 0.1 s of untimed runs. The machine is shared and
noisy: read the ratios, not the seconds.

Thread scaling (issue 37): attention's forward + backward (both cases) on one thread and
on two, the engine's and torch's, the four taking turns in the same rounds; the engine's
gain, time on one thread / time on two, must be at least TARGET_SCALING (torch's printed
beside it). "One thread" holds BLAS to one thread as well (threadpoolctl), as the engine's
two threads do while a plan runs. Needs two cores; skipped with fewer.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np
import op_timing
import threadpoolctl
import torch
from bench_cpu import engine_backward, engine_forward, same_threads
from tabulate import tabulate

from engine import ops
from engine.backends.cpu import threads as engine_threads
from engine.backends.cpu.environment import default_threads

TARGET_RATIO = 1.5
TARGET_SCALING = 1.8          # attention fwd + bwd, engine time on 1 thread / on 2
PAUSE_S = 0.5
# untimed runs after each pause: this VM's idle cores take milliseconds to wake, and an
# engine whose worker threads block (never spin) met a sleeping core in the first few runs
# after it (6 ms against 3.5 for attention's forward), where torch's spinning workers kept
# theirs awake
WARM_S = 0.1
FREQ_BASE = 10000.0


def attention_case(rng, hq, hkv, t, d):
    """(name, engine build, torch function, inputs): causal attention, batch 1."""
    q, k, v = (rng.normal(size=(1, h, t, d)).astype(np.float32) for h in (hq, hkv, hkv))
    name = f"attention causal {hq}/{hkv} heads T={t} D={d} f32"
    # attention_fwd: attention is its view [..., :Dv], and its backward rule is
    # attention_back's node (the lse column's gradient costs nothing more)
    return (name, lambda q, k, v: ops.attention_fwd(q, k, v, causal=True),
            lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=hq != hkv), [q, k, v])


def torch_rope(x, pos):
    """Mode normal over the whole head (n_dims = D), from the formulas: theta_ti =
    pos_t base^(-2i/D), pairs (x[2i], x[2i+1]) rotated by theta_ti."""
    d = x.shape[-1]
    inv_freq = FREQ_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    theta = pos.to(torch.float32)[:, None] * inv_freq
    c, s = torch.cos(theta)[:, None, :], torch.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).flatten(-2)


def rope_case(rng, t, h, d):
    x = rng.normal(size=(t, h, d)).astype(np.float32)
    pos = np.arange(t, dtype=np.int32)
    return (f"rope ({t}, {h}, {d}) f32", lambda x, p: ops.rope(x, p, n_dims=d,
                                                               freq_base=FREQ_BASE),
            torch_rope, [x, pos])


def _time_rounds(timers, repeat, rounds, settings=None, statistic="min"):
    """Seconds of each zero-argument call in `timers` (the `statistic` of its timed runs,
    op_timing.STATISTICS: the fastest by default, as bench_ops takes), timed in `rounds` rounds of
    repeat // rounds runs each, the calls taking turns round by round (a load that comes
    and goes on the shared machine meets both sides), after a pause before each turn
    (torch's workers keep spinning a while after its calls) and WARM_S of untimed runs.
    settings[i], where given, is a context manager factory entered around call i's turns
    (its thread counts)."""
    times = [[] for _ in timers]
    settings = settings or [contextlib.nullcontext] * len(timers)
    for _ in range(rounds):
        for fn, setting, out in zip(timers, settings, times, strict=True):
            with setting():
                time.sleep(PAUSE_S)
                warm_until = time.perf_counter() + WARM_S
                fn()                            # warm-up: compile, caches, pages, and
                while time.perf_counter() < warm_until:     # cores woken from the pause
                    fn()
                for _ in range(max(1, repeat // rounds)):
                    t0 = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - t0)
    return [op_timing.STATISTICS[statistic](t) for t in times]


@contextlib.contextmanager
def _on_threads(n):
    """The engine (its plans bound inside), torch and BLAS on `n` threads while the block
    runs, as they were after."""
    engine_before, torch_before = engine_threads.get_num_threads(), torch.get_num_threads()
    engine_threads.set_num_threads(n)
    torch.set_num_threads(n)
    try:
        with threadpoolctl.threadpool_limits(limits=n, user_api="blas"):
            yield
    finally:
        engine_threads.set_num_threads(engine_before)
        torch.set_num_threads(torch_before)


def scaling(name, build, torch_fn, arrays, repeat, rounds, statistic="min"):
    """[name, engine 1 thread, engine 2 threads, torch 1, torch 2]: forward + backward
    seconds (the sums of their figures), the engine's plans bound on each count."""
    plans = {}
    for n in (1, 2):
        with _on_threads(n):
            plans[n] = (engine_forward(build, arrays)[0], engine_backward(build, arrays))
    tens = [torch.from_numpy(a.copy()) for a in arrays]
    req = [t.clone().requires_grad_(True) for t in tens]
    y = torch_fn(*req)
    g = torch.from_numpy(np.random.default_rng(1).normal(size=tuple(y.shape))
                         .astype(np.float32))

    def torch_forward():
        with torch.no_grad():
            torch_fn(*tens)

    def torch_backward():
        torch.autograd.grad(y, req, g, retain_graph=True)
    timers, settings = [], []
    for n in (1, 2):
        timers += [plans[n][0].compute, plans[n][1].compute, torch_forward, torch_backward]
        settings += [lambda n=n: _on_threads(n)] * 4
    t = _time_rounds(timers, repeat, rounds, settings, statistic)
    return [name, t[0] + t[1], t[4] + t[5], t[2] + t[3], t[6] + t[7]]


def bench(name, build, torch_fn, arrays, repeat, rounds, statistic="min"):
    """[name, engine fwd, engine bwd, torch fwd, torch bwd] in seconds."""
    fwd, _ = engine_forward(build, arrays)
    bwd = engine_backward(build, arrays)
    tens = [torch.from_numpy(a.copy()) for a in arrays]
    floats = [i for i, a in enumerate(arrays) if a.dtype == np.float32]
    req = [t.clone().requires_grad_(True) if i in floats else t for i, t in enumerate(tens)]
    y = torch_fn(*req)
    g = torch.from_numpy(np.random.default_rng(1).normal(size=tuple(y.shape))
                         .astype(np.float32))
    leaves = [req[i] for i in floats]

    def torch_forward():
        with torch.no_grad():
            torch_fn(*tens)
    e_fwd, e_bwd, t_fwd, t_bwd = _time_rounds(
        [fwd.compute, bwd.compute, torch_forward,
         lambda: torch.autograd.grad(y, leaves, g, retain_graph=True)], repeat, rounds,
        statistic=statistic)
    return [name, e_fwd, e_bwd, t_fwd, t_bwd]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=15, help="timed runs per figure")
    p.add_argument("--statistic", choices=tuple(op_timing.STATISTICS), default="min",
                   help="what a figure is of its timed runs, the same on both sides: the "
                        "fastest (default; see bench/op_timing.py) or the median")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds the timed runs are cut into, engine and torch taking turns")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for the engine and for torch alike (default: each's own)")
    p.add_argument("--part", choices=("all", "ratios", "scaling"), default="all",
                   help="engine/torch ratios, the 1 -> 2 threads gain, or both")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.repeat < 1:
        p.error("--repeat and --rounds must be at least 1")
    same_threads(p, args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; engine threads "
          f"{engine_threads.get_num_threads()}; the {args.statistic} of {args.repeat} runs in "
          f"{args.rounds} rounds")
    rng = np.random.default_rng(0)
    cases = [attention_case(rng, 8, 8, 512, 64), attention_case(rng, 8, 2, 512, 64),
             rope_case(rng, 512, 8, 64), rope_case(rng, 2048, 32, 128)]
    ok = True
    if args.part in ("all", "ratios"):
        ok = ratios(cases, args.repeat, args.rounds, args.statistic) and ok
    if args.part in ("all", "scaling"):
        ok = thread_scaling(cases[:2], args.repeat, args.rounds, args.statistic) and ok
    print("all targets met" if ok else "SOME TARGETS MISSED")
    return 0 if ok else 1


def thread_scaling(cases, repeat, rounds, statistic="min") -> bool:
    """The 1 -> 2 threads table of attention's cases; whether each met TARGET_SCALING."""
    if default_threads() < 2:
        print("thread scaling: skipped (this process may use one core)")
        return True
    table, ok = [], True
    for name, e1, e2, t1, t2 in (scaling(*c, repeat, rounds, statistic) for c in cases):
        gain = e1 / e2
        ok = ok and gain >= TARGET_SCALING
        table.append([name, f"{e1 * 1e3:.2f}", f"{e2 * 1e3:.2f}", f"{gain:.2f}",
                      f"{t1 * 1e3:.2f}", f"{t2 * 1e3:.2f}", f"{t1 / t2:.2f}",
                      "ok" if gain >= TARGET_SCALING else "LESS THAN TARGET"])
    print(tabulate(table, headers=["case (fwd + bwd)", "engine 1T ms", "engine 2T ms",
                                   "engine gain", "torch 1T ms", "torch 2T ms", "torch gain",
                                   f"target >= {TARGET_SCALING:g}"]))
    return ok


def ratios(cases, repeat, rounds, statistic="min") -> bool:
    """The engine/torch table of every case; whether each met TARGET_RATIO."""
    table, ok = [], True
    for name, e_fwd, e_bwd, t_fwd, t_bwd in (bench(*c, repeat, rounds, statistic) for c in cases):
        for phase, e, t in (("forward", e_fwd, t_fwd), ("backward", e_bwd, t_bwd),
                            ("fwd + bwd", e_fwd + e_bwd, t_fwd + t_bwd)):
            ratio = e / t
            verdict = ""
            if phase == "fwd + bwd":      # every case's: the target
                ok = ok and ratio <= TARGET_RATIO
                verdict = "ok" if ratio <= TARGET_RATIO else "SLOWER THAN TARGET"
            table.append([name, phase, f"{e * 1e3:.2f}", f"{t * 1e3:.2f}", f"{ratio:.2f}",
                          verdict])
    print(tabulate(table, headers=["case", "pass", "engine ms", "torch ms", "engine/torch",
                                   f"target <= {TARGET_RATIO:g}"]))
    return ok


if __name__ == "__main__":
    sys.exit(main())
