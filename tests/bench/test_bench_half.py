"""bench/bench_half.py without timing anything: its options, its timing through
op_timing.time_rounds (the calls of every dtype in the same alternating rounds, the statistic
of each call's timed runs, on a fake clock), its targets and its exit status (timings
planted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import bench_half  # noqa: E402
import op_timing  # noqa: E402


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--rounds", "0"], ["--threads", "0"],
                                  ["--statistic", "mean"]])
def test_bad_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_half.parse(argv)
    assert exit_.value.code == 2
    assert "bench_half: error:" in capsys.readouterr().err


def test_the_defaults_take_the_fastest_run_in_three_rounds():
    args = bench_half.parse([])
    assert (args.statistic, args.rounds, args.repeat) == ("min", 3, 15)


@pytest.fixture
def clock(monkeypatch):
    """A fake clock that each planted call advances by its next duration; no pauses."""
    now = [0.0]
    monkeypatch.setattr(op_timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(op_timing.time, "sleep", lambda s: None)
    return now


@pytest.mark.parametrize("statistic", ["min", "median"])
def test_every_dtype_is_timed_in_the_same_alternating_rounds(clock, monkeypatch, statistic):
    """measure: the 12 calls of a case (engine and torch, forward and backward, in three
    dtypes) take turns in each round, in order and then reversed; each call's figure is
    the statistic of its own timed runs, its untimed first call left out; a disturbed run
    (9 s) moves a median, not a minimum."""
    order = []

    def planted(build, torch_fn, arrays, dtype):
        def call(k):
            durations = iter([1.0] + [2.0 + k, 9.0 + k, 2.5 + k])     # first call untimed
            def run():
                order.append((dtype, k))
                clock[0] += next(durations)
            return run
        return [call(k) for k in range(4)]
    monkeypatch.setattr(bench_half, "calls", planted)
    times = bench_half.measure(None, None, [], repeat=3, rounds=3, statistic=statistic)
    keys = [(d, k) for d in bench_half.DTYPES for k in range(4)]
    assert order[:12] == keys                                  # the untimed first calls
    assert order[12:24] == keys and order[24:36] == keys[::-1] and order[36:] == keys
    for dtype in bench_half.DTYPES:
        for j, phase in enumerate(bench_half.PHASES):
            e, t = times[dtype][phase]           # calls 2j (engine) and 2j + 1 (torch)
            assert e == (2.0 if statistic == "min" else 2.5) + 2 * j
            assert t == e + 1


def _times(**ratios):
    """measure's dict with the engine's float32 at 1 s and torch at 1 s everywhere, but the
    engine's 16-bit times given (dtype -> engine seconds, both phases)."""
    return {d: {p: (ratios.get(d, 1.0), 1.0) for p in bench_half.PHASES}
            for d in bench_half.DTYPES}


def test_bfloat16_matmul_is_judged_against_the_engines_float32_product():
    times = _times(bf16=1.3)
    times["bf16"]["forward"] = (1.2, 0.1)                # 12x torch's AMX product: fine
    assert bench_half.judge("matmul 4x4", "bf16", "forward", times)[2]
    ratio, verdict, met = bench_half.judge("matmul 4x4", "bf16", "backward", times)
    assert not met and "1.30 x engine f32" in verdict and ratio == pytest.approx(1.3)
    assert not bench_half.judge("softmax rows", "f16", "forward", _times(f16=2.1))[2]
    assert bench_half.judge("softmax rows", "bf16", "forward", _times(bf16=1.9))[2]
    assert bench_half.judge("matmul 4x4", "f32", "forward", _times(f32=9.0))[2]


@pytest.mark.parametrize("bf16, statistic, code", [(1.2, "min", 0), (1.3, "median", 1)])
def test_the_exit_status_and_the_statistic(monkeypatch, capsys, bf16, statistic, code):
    asked = []

    def planted(build, torch_fn, arrays, repeat, rounds, statistic="min"):
        asked.append((repeat, rounds, statistic))
        return _times(bf16=bf16)
    monkeypatch.setattr(bench_half, "measure", planted)
    monkeypatch.setattr(bench_half, "forward_bytes", lambda build, arrays: arrays[0].itemsize)
    assert bench_half.main(["--statistic", statistic, "--repeat", "4"]) == code
    out = capsys.readouterr().out
    assert asked == [(4, 3, statistic)] * 3
    assert f"the {statistic} of 4 runs in 3 rounds" in out
    assert ("all targets met" if code == 0 else "SOME TARGETS MISSED") in out


def test_case_picks_the_cases_whose_name_contains_it(monkeypatch, capsys):
    asked = []

    def planted(build, torch_fn, arrays, repeat, rounds, statistic="min"):
        asked.append(len(arrays))
        return _times()
    monkeypatch.setattr(bench_half, "measure", planted)
    monkeypatch.setattr(bench_half, "forward_bytes", lambda build, arrays: arrays[0].itemsize)
    assert bench_half.main(["--case", "matmul"]) == 0
    assert asked == [2]                                  # matmul's two operands only
    assert "softmax" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        bench_half.parse(["--case", "conv"])
    assert exit_.value.code == 2 and "no case contains 'conv'" in capsys.readouterr().err
