"""bench/bench_ops.py and bench/op_timing.py without timing anything: the options, the
target rules, the registry's coverage (a new op without bench cases or a reason fails
here), the torch side computing in the case's dtype, the harness's gradients against
torch's, the table's order and the exit status (timings planted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.registry import OpDef, all_ops, get_op, register, unregister
from engine.samples import InputSpec, Sample
from engine.scale_cases import bench_case
from engine.tensor import as_dtype

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import bench_ops  # noqa: E402
import op_timing  # noqa: E402

CASES, SKIPPED = bench_ops.bench_cases()


def _case(op: str, text: str = "") -> Sample:
    return next(c for c in CASES if c.op == op and text in str(c))


# --- options -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--op", "softmx"], "bench_ops: unknown op 'softmx'; did you mean softmax? "
                         "(bench_ops --list shows all)"),
    (["--repeat", "0"], "bench_ops: error: --repeat and --rounds must be at least 1 "
                        "(see bench_ops --help)"),
    (["--rounds", "-1"], "bench_ops: error: --repeat and --rounds must be at least 1 "
                         "(see bench_ops --help)"),
    (["--threads", "0"], "bench_ops: error: --threads must be at least 1, got 0 "
                         "(see bench_ops --help)"),
    (["--repeat", "x"], "bench_ops: error: argument --repeat: invalid int value: 'x' "
                        "(see bench_ops --help)"),
])
def test_bad_options_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        bench_ops.main(argv)
    assert stop.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.splitlines() == [message]


def test_a_bad_dtype_names_the_closest_choice(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_ops.parse(["--dtype", "bf61"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bf61'; did you mean bf16?" in err and len(err.splitlines()) == 1


def test_options_select_ops_and_dtypes():
    args = bench_ops.parse(["--op", "softmax", "--op", "gelu", "--dtype", "f16",
                            "--dtype", "f16", "--dtype", "bf16"])
    assert args.op == ["softmax", "gelu"] and args.dtypes == ("f16", "bf16")
    assert bench_ops.parse([]).dtypes == bench_ops.DTYPES
    assert bench_ops.parse(["--dtype", "f32", "--dtype", "all"]).dtypes == bench_ops.DTYPES
    cases, skipped = bench_ops.bench_cases(["softmax", "gelu", "relu_back"], ("f16", "bf16"))
    assert {c.op for c in cases} == {"softmax", "gelu"} and cases
    assert {c.dtype for c in cases} == {"f16", "bf16"}
    assert list(skipped) == ["relu_back"]


def test_an_unwritable_json_and_a_bad_thread_setting_are_refused_first(tmp_path, capsys,
                                                                       monkeypatch):
    assert bench_ops.main(["--op", "relu", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"bench_ops: cannot write {tmp_path}")
    monkeypatch.setenv("GRADVERIFY_THREADS", "zero")
    assert bench_ops.main(["--op", "relu"]) == 2
    assert capsys.readouterr().err.startswith("bench_ops: GRADVERIFY_THREADS must be")


def test_list_prints_the_cases_and_the_skipped_ops_and_times_nothing(capsys, monkeypatch):
    monkeypatch.setattr(op_timing, "time_case", lambda *a, **k: pytest.fail("timed"))
    assert bench_ops.main(["--list", "--op", "matmul", "--op", "attention_fwd"]) == 0
    out = capsys.readouterr().out
    assert "matmul(type=bf16,a=[512,1024],b=[1024,2048])" in out
    assert "| attention_fwd " in out and "timed by attention's case" in out


# --- targets -------------------------------------------------------------------------------
@pytest.mark.parametrize("op,text,limit,rule,against", [
    ("gelu", "type=f32", 1.2, "activation", "torch"),
    ("silu", "type=bf16", 1.2, "activation", "torch"),
    ("relu", "type=f32", 1.5, "every op", "torch"),
    ("exp", "type=f32", 1.5, "every op", "torch"),
    ("softmax", "type=f16,x=[8,512,512],scale=1", 2.0, "16-bit softmax", "torch"),
    ("softmax", "type=bf16,x=[8,512,512],mask", 2.0, "16-bit softmax", "torch"),
    ("softmax", "type=f32,x=[8,512,512],scale=1", 1.5, "every op", "torch"),
    ("softmax", "type=f32,x=[8,512,512],mask=[512,512],sinks", 1.5,
     "masked softmax, ALiBi and sinks", "torch"),
    ("matmul", "type=bf16", 1.25, "bfloat16 matmul, against its float32 twin", "engine f32"),
    ("matmul", "type=f16", 1.5, "every op", "torch"),
    ("sum", "type=f32,x=[4096,4096],axis=-1", 1.5, "row sums", "torch"),
    ("sum", "type=f32,x=[4096,4096],axis=None", 1.5, "every op", "torch"),
    ("pool_2d", "kernel=[3,3],mode=max", 1.5, "max pooling, general backward", "torch"),
    ("pool_2d", "kernel=[2,2],mode=max", 1.5, "every op", "torch"),
])
def test_targets_follow_the_issue(op, text, limit, rule, against):
    assert bench_ops.target_for(_case(op, text)) == bench_ops.Target(limit, rule, against)


def _timing(e_fb, t_fb, e32_fb=None, e_fwd=1.0, t_fwd=1.0):
    return op_timing.Timing(e_fwd, t_fwd, e_fb, t_fb, None if e32_fb is None else 1.0, e32_fb)


def test_judging_against_torch_against_the_float32_twin_and_without_a_gradient():
    gelu = _case("gelu", "type=f32")
    assert bench_ops.judge(gelu, _timing(1.19, 1.0)).met
    row = bench_ops.judge(gelu, _timing(1.21, 1.0))
    assert not row.met and row.judged == pytest.approx(1.21) and row.target == 1.2
    bf16 = _case("matmul", "type=bf16")
    row = bench_ops.judge(bf16, _timing(3.0, 1.0, e32_fb=2.5))   # 3x torch, 1.2x its twin
    assert row.met and row.judged == pytest.approx(1.2) and row.ratio_fb == pytest.approx(3.0)
    assert not bench_ops.judge(bf16, _timing(3.2, 5.0, e32_fb=2.5)).met
    argmax = bench_ops.judge(_case("argmax"), op_timing.Timing(1.6, 1.0))
    assert argmax.ratio_fb is None and argmax.judged == pytest.approx(1.6) and not argmax.met


# --- coverage of the registry --------------------------------------------------------------
def test_every_registered_op_has_bench_cases_or_a_reason():
    assert bench_ops.coverage_problems() == []
    assert set(SKIPPED) | {c.op for c in CASES} == set(all_ops())


def test_a_new_op_without_bench_cases_is_a_coverage_problem():
    register(OpDef("toy_untimed", infer=lambda x: (x.shape, x.dtype),
                   backward=lambda g, out, x: (g,), torch=lambda x: x))
    try:
        problems = bench_ops.coverage_problems()
    finally:
        unregister("toy_untimed")
    assert problems == ["toy_untimed: no bench cases (OpDef.bench) and no reason to skip it "
                        "(bench_ops.SKIPPED)"]


def test_bench_cases_are_bench_tier_of_their_op_and_fit_in_memory():
    for op in all_ops().values():
        for case in (op.bench() if op.bench else []):
            assert case.tier == "bench" and case.op == op.name, case
    for case in CASES:
        shape, dtype = op_timing.output_of(case)          # builds: shapes and params valid
        size = sum(int(np.prod(s.shape)) * as_dtype(s.dtype or case.dtype).itemsize
                   for s in case.inputs) + int(np.prod(shape)) * dtype.itemsize
        assert 1 << 20 <= size <= 256 << 20, f"{case}: {size} bytes"
        if get_op(case.op).differentiable:
            assert op_timing.differentiated(case), case
    # the issue's sizes and dtypes
    assert {c.dtype for c in CASES if c.op in ("softmax", "sum", "matmul", "norm", "rms_norm",
                                                "gelu", "silu")} == {"f32", "f16", "bf16"}
    for text in ("softmax(type=f32,x=[8,512,512],scale=1)",
                 "softmax(type=f32,x=[8,512,512],mask=[512,512],scale=0.125)",
                 "softmax(type=f32,x=[8,512,512],mask=[512,512],sinks=[8],max_bias=8,"
                 "scale=0.125)", "gelu(type=f32,x=[2048,4096])", "norm(type=f32,x=[4096,4096]"):
        assert any(str(c).startswith(text) for c in CASES), text


# --- the torch side computes in the case's dtype -------------------------------------------
def _float64_ops(fn, case, arrays) -> list[str]:
    """The aten ops that made a float64 tensor at least as large as the case's largest float
    input while fn(*inputs) ran its forward (where no input is float64)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from gradcheck.adapters.torch_adapter import as_torch, torch_view
    floor = max(a.size for a in arrays if a.dtype.kind == "f")
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.extend(str(func) for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                        and t.dtype == torch.float64 and t.numel() >= floor)
            return out
    tensors = [torch_view(s, as_torch(s.to_leaf(a))) for s, a in zip(case.inputs, arrays,
                                                                     strict=True)]
    with torch.no_grad(), Watch():
        fn(*tensors, **case.kwargs)
    return seen


def _f32_samples(op, n=4):
    return [s for s in (op.samples() if op.samples else []) if s.float_dtypes == {"f32"}][:n]


@pytest.mark.parametrize("name", sorted({c.op for c in CASES}))
def test_the_timed_torch_function_computes_in_the_case_dtype(name):
    op = get_op(name)
    for sample in _f32_samples(op):
        arrays = sample.generate_inputs()
        assert _float64_ops(op_timing.torch_function(op), sample, arrays) == [], sample


def test_the_float64_references_are_seen_by_that_check():
    """The check can fail: the references that compute in float64 (and are why those ops
    have a bench_torch) are caught by it."""
    for name, text in (("norm", ""), ("rms_norm", ""), ("softmax", "mask="), ("rope", "")):
        op = get_op(name)
        sample = next(s for s in _f32_samples(op, 50) if text in str(s))
        assert _float64_ops(op.torch, sample, sample.generate_inputs()), name


# values differ by design: torch's dropout draws its mask from its own generator
OTHER_VALUES = {"dropout": "torch's mask, not the engine's hash"}


@pytest.mark.parametrize("name", sorted(n for n, op in all_ops().items() if op.bench_torch))
def test_bench_torch_agrees_with_the_reference(name):
    import torch

    from gradcheck.adapters.torch_adapter import as_torch, torch_view
    op = get_op(name)
    for sample in _f32_samples(op):
        arrays = sample.generate_inputs()
        tensors = [torch_view(s, as_torch(s.to_leaf(a))) for s, a in zip(sample.inputs, arrays,
                                                                         strict=True)]
        with torch.no_grad():
            want = op.torch(*tensors, **sample.kwargs)
            got = op.bench_torch(*tensors, **sample.kwargs)
        assert got.shape == want.shape and got.dtype == want.dtype, sample
        if name not in OTHER_VALUES:
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=str(sample))


# --- the harness computes what torch computes ----------------------------------------------
SMALL = [bench_case("softmax", [InputSpec("x", (2, 3, 5), "uniform", -3.0, 3.0),
                                InputSpec("mask", (3, 5), "uniform", -5.0, 0.0, grad=False),
                                InputSpec("sinks", (2,), "uniform", -1.0, 3.0)],
                    scale=0.5, max_bias=8.0),
         bench_case("conv_2d", [InputSpec("x", (2, 3, 6, 6)), InputSpec("w", (4, 3, 3, 3))],
                    dilation=1, padding=1, stride=1),
         bench_case("cont", [InputSpec("x", (2, 3, 4, 5), permute=(0, 2, 1, 3))]),
         bench_case("add", [InputSpec("a", (3, 4)), InputSpec("b", (4,))]),
         bench_case("transpose", [InputSpec("x", (3, 4))]),
         bench_case("sum", [InputSpec("x", (3, 4))], axis=-1, keepdims=False),
         bench_case("attention", [InputSpec("q", (1, 2, 4, 3)), InputSpec("k", (1, 2, 4, 3)),
                                  InputSpec("v", (1, 2, 4, 3))], causal=True, scale=0.5),
         bench_case("mlp_block", [InputSpec("x", (3, 4)), InputSpec("ffn_norm", (4,)),
                                  InputSpec("w_gate", (6, 4)), InputSpec("w_up", (6, 4)),
                                  InputSpec("w_down", (4, 6))], eps=1e-5)]


@pytest.mark.parametrize("case", SMALL, ids=str)
def test_the_engine_graphs_compute_what_torch_computes(case):
    arrays = case.generate_inputs()
    shape, dtype = op_timing.output_of(case)
    g = op_timing.upstream(shape, dtype)
    fwd, both, grads = op_timing.engine_graphs(case, arrays, g)
    results = {}
    t_fwd, t_fb = op_timing.torch_calls(case, arrays, g, results)
    t_fwd()
    t_fb()
    tol = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fwd.outputs[0].numpy(), results["forward"].numpy(), **tol)
    np.testing.assert_allclose(both.outputs[0].numpy(), results["output"].detach().numpy(),
                               **tol)
    assert len(grads) == len(results["grads"]) == len(op_timing.differentiated(case))
    for mine, theirs in zip(grads, results["grads"], strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), **tol)


# --- the table and the exit status ---------------------------------------------------------
def _row(label, ratio_fb, ratio_fwd=1.0, met=True):
    return bench_ops.Row(label, label, "op", "f32", ratio_fwd, 1.0, ratio_fb, 1.0, 1.5,
                         "every op", "torch", ratio_fb or ratio_fwd, met)


def test_rows_sort_worst_first_by_forward_backward_then_forward():
    rows = [_row("a", 0.5), _row("b", 2.0, met=False), _row("c", None, ratio_fwd=1.7),
            _row("d", 0.5, ratio_fwd=3.0)]
    assert [r.label for r in bench_ops.sorted_rows(rows)] == ["b", "c", "d", "a"]
    lines = bench_ops.table(rows).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["b", "c", "d", "a"]
    assert [line.split("|")[-2].strip() for line in lines[2:]] == ["MISS", "ok", "ok", "ok"]


@pytest.fixture
def planted(monkeypatch):
    """time_case planted: every case at ratio 1.0, but gelu's forward + backward at 3x;
    malloc left as it is (its calls counted)."""
    calls = []
    monkeypatch.setattr(op_timing, "reuse_freed_memory", lambda: calls.append(1) or True)
    def fake(case, repeat, rounds, engine_twin=None, statistic="min",
             pause=op_timing.PAUSE_S):
        calls.append(statistic if pause == op_timing.PAUSE_S else (statistic, pause))
        slow = 3.0 if case.op == "gelu" else 1.0
        timing = op_timing.Timing(0.002, 0.002, 0.004 * slow, 0.004)
        if engine_twin:
            timing.engine32_fwd, timing.engine32_fb = 0.002, 0.004
        return timing
    monkeypatch.setattr(op_timing, "time_case", fake)
    return calls


def test_a_slow_op_fails_the_run_and_tops_the_table(planted, tmp_path, capsys):
    out = tmp_path / "ops.json"
    assert bench_ops.main(["--op", "relu", "--op", "gelu", "--op", "matmul", "--json",
                           str(out)]) == 1
    text = capsys.readouterr()
    table = [line for line in text.out.splitlines() if line.startswith("| ")
             and "(type=" in line]
    assert table[0].startswith("| gelu(type=") and "MISS" in table[0]
    assert sum("MISS" in line for line in table) == 3        # gelu in three dtypes
    assert "9 cases, 6 met, 3 missed" in text.out
    assert text.err.count("\n") == 9 and "[1/9] " in text.err      # progress per case
    record = json.loads(out.read_text())
    assert record["schema"] == bench_ops.SCHEMA and len(record["rows"]) == 9
    assert record["rows"][0]["op"] == "gelu" and not record["rows"][0]["met"]
    assert record["meta"]["threads"] >= 1 and record["meta"]["malloc_reuses"] is True
    assert planted == [1] + ["min"] * 9
    assert record["meta"]["statistic"] == "min"


def test_all_targets_met_exits_0(planted, capsys):
    assert bench_ops.main(["--op", "relu", "--op", "matmul", "--default-malloc"]) == 0
    out = capsys.readouterr().out
    assert "all targets met" in out and "malloc as glibc sets it" in out
    assert planted == ["min"] * 6


def test_the_median_is_there_on_request(planted, capsys):
    assert bench_ops.main(["--op", "relu", "--dtype", "f32", "--statistic", "median",
                           "--default-malloc"]) == 0
    assert planted == ["median"] and "the median of 6 runs" in capsys.readouterr().out


def test_the_pause_is_there_on_request(planted, capsys):
    assert bench_ops.main(["--op", "relu", "--dtype", "f32", "--pause", "0.2",
                           "--default-malloc"]) == 0
    assert planted == [("min", 0.2)] and "after pauses of 0.2 s" in capsys.readouterr().out
    for bad in ("-0.1", "11", "nan"):
        with pytest.raises(SystemExit) as exit_:
            bench_ops.parse(["--pause", bad])
        assert exit_.value.code == 2
    assert "--pause must lie in [0, 10] seconds" in capsys.readouterr().err


@pytest.mark.parametrize("statistic, expected", [("min", [1.0, 2.0]), ("median", [5.0, 6.0])])
def test_time_rounds_takes_the_statistic_of_each_calls_timed_runs(monkeypatch, statistic,
                                                                  expected):
    """On a clock that each call advances by its next duration: the first call untimed, the
    rest taken in turns; a disturbed run (9.0) moves the median but not the minimum."""
    clock = [0.0]
    monkeypatch.setattr(op_timing.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(op_timing.time, "sleep", lambda s: None)
    def call(durations):
        it = iter(durations)
        return lambda: clock.__setitem__(0, clock[0] + next(it))
    # each: one untimed first call (1.0 s, past WAKE_S: no wake-up calls), then 3 timed
    calls = [call([1.0, 5.0, 1.0, 9.0]), call([1.0, 6.0, 2.0, 6.0])]
    assert op_timing.time_rounds(calls, repeat=3, rounds=3, statistic=statistic,
                                 budget=100.0) == expected
