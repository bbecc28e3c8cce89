"""The scale tier (gradcheck.scale): every op declares scale cases, they pass on the correct
engine, and the bugs only they can see are caught: a chunk boundary dropped at a thread
split, a float32 accumulator, a result that depends on the thread count."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cpu import threads
from engine.mutation.kernels import chunk_ends_one_short
from engine.mutation.patches import chunks_replaced, prepare_replaced
from engine.ops.reduce import sum_rows_float32_accumulator
from engine.registry import all_ops, get_op
from gradcheck import cotangents, precision, scale
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.check import check_sample
from gradcheck.cli import main
from gradcheck.runner import checkable_ops, select_samples

# checkable ops without scale cases, and why (a view op has no kernel of its own: what it
# costs is in the kernels of its consumers and of its backward, which have scale cases)
NO_SCALE = {"argmax": "no gradient"}


def _scale_case(op: str, text: str):
    return next(c for c in get_op(op).scale() if text in str(c))


def test_every_checkable_op_declares_scale_cases_or_says_why_not():
    missing = [name for name in checkable_ops()
               if get_op(name).scale is None and name not in NO_SCALE
               and get_op(name).kind not in ("view", "backward")]
    assert not missing, f"ops without scale cases: {missing}"


def test_scale_cases_are_scale_tier_and_big():
    for op in all_ops().values():
        for case in (op.scale() if op.scale else []):
            assert case.tier == "scale", case
            sizes = [int(np.prod(spec.shape)) for spec in case.inputs]
            sizes.append(int(np.prod(cotangents._output(case).shape)))
            assert max(sizes) >= 1 << 16, f"{case}: too small to take a fast path"


def test_tier_selects_cases():
    fast = select_samples(["sum"])
    scaled = select_samples(["sum"], tier="scale")
    both = select_samples(["sum"], tier="all")
    assert all(c.tier == "fast" for c in fast) and all(c.tier == "scale" for c in scaled)
    assert len(both) == len(fast) + len(scaled) and scaled


@pytest.mark.parametrize("op,text", [("sum", "x=[1500007,3]"), ("matmul", "a=[1000,784]"),
                                     ("pool_2d", "kernel=[2,2],mode=max,padding=[0,0],"
                                                 "stride=[2,2])")])
def test_scale_rows_pass_with_their_metrics(op, text):
    r = check_sample(_scale_case(op, text))
    assert r.status == "pass", r.message
    assert r.labels["tier"] == "scale" and r.labels["mode"] == "fast"
    assert r.metrics["reference"] == "torch f64"
    assert r.metrics["directions"] == f"{scale.DIRECTIONS}/{scale.DIRECTIONS} agree"
    assert r.metrics["threads"].startswith("1,2,3,7,numba-parallel: ")
    assert r.metrics["paths"] != "none"
    assert r.metrics["ratio"] <= precision.PRECISION_RATIO


def test_without_torch_the_reference_is_the_plain_float64_engine():
    r = check_sample(_scale_case("sum", "axis=None"), use_torch=False)
    assert r.status == "pass", r.message
    assert r.metrics["reference"] == "plain f64" and "ratio" not in r.metrics


def test_a_chunk_boundary_bug_is_caught_by_the_scale_tier_only():
    case = _scale_case("relu", "relu(type=f32,x=[1031,1031])")
    small = select_samples(["relu"], "f32")[0]
    with chunks_replaced("relu", chunk_ends_one_short):
        assert check_sample(small).status == "pass"
        r = check_sample(case)
    assert r.status == "fail"
    assert "forward" in r.message or "threads" in r.message


def test_a_float32_accumulator_is_caught_by_the_precision_verdict():
    case = _scale_case("sum", "x=[1500007,3]")
    with prepare_replaced("sum", sum_rows_float32_accumulator):
        r = check_sample(case)
    assert r.status == "fail", r.metrics
    assert "precision" in r.message and r.metrics["ratio"] > precision.PRECISION_RATIO
    # the fixed float32 tolerance alone would have let it pass
    assert "forward:" not in r.message


def _wrong_at_seven_threads(prepare):
    """A preparation whose call, bound at 7 engine threads, scales its chunk's first
    output element by 1.5: a result that depends on the thread count."""
    def mutated(out, ins, **params):
        call = prepare(out, ins, **params)
        if threads.get_num_threads() != 7:
            return call

        def wrong():
            call()
            out.reshape(-1)[0] *= 1.5
        return wrong
    return mutated


def test_a_thread_dependent_result_is_caught():
    case = _scale_case("exp", "exp(type=f32,x=[1031,1031])")
    with prepare_replaced("exp", _wrong_at_seven_threads):
        r = check_sample(case)
    assert r.status == "fail" and "threads: output at 7 threads" in r.message


def test_thread_problem_exact_and_rounded():
    a = np.ones((4, 4), np.float32)
    b = a.copy()
    b[0, 0] = np.nextafter(np.float32(1), np.float32(2))
    runs = {1: (a, [a]), 2: (b, [a])}
    metric, problem = scale._thread_problem(runs, True, "f32", [0])
    assert problem and "1/16 elements" in problem
    metric, problem = scale._thread_problem(runs, False, "f32", [0])
    assert problem is None and metric == "1,2: agree within rounding"




def test_simulated_cuda_rows_are_unsupported(monkeypatch):
    monkeypatch.setattr(scale, "_simulated", lambda: True)
    r = check_sample(_scale_case("sum", "axis=None"), adapter=EngineAdapter("cuda"))
    assert r.status == "unsupported" and "simulator" in r.message


def test_cli_tier_scale(capsys):
    assert main(["--op", "sum", "--tier", "scale", "-k", "x=[1500007,3]", "--no-progress",
                 "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"tier": "scale"' in out and "1500007" in out


def test_cli_bad_tier_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--op", "sum", "--tier", "huge"])
    assert exc.value.code == 2


def test_a_failing_scale_row_reproduces_with_tier_scale():
    from gradcheck.repro import repro_command
    case = _scale_case("sum", "x=[1500007,3]")
    command = repro_command(case, EngineAdapter())
    assert "--tier scale" in command and "--op sum" in command
