"""gradcheck's self-test: every known bug is caught, by the cheapest tier that sees it, the
registry comes back intact, a bug that changes nothing is reported as missed (so the
self-test itself can fail), and the control (the machinery with no bug) passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.backends.cpu import CPU, half
from engine.mutation.patches import REPLACEABLE, kernel_replaced, scaled
from engine.ops.pad import pad_border_unwritten
from engine.registry import all_ops, get_op
from gradcheck.check import check_sample
from gradcheck.injection import injected, parse
from gradcheck.mutants import CONTROL, KINDS, MUTANTS, TIERS, Mutant
from gradcheck.selftest import caught_by, mutant_cases, power, run_mutant, run_self_test
from reports import Result

# the kinds of bugs the self-test must hold (gradcheck's power over kernels, not only rules)
REQUIRED_KINDS = ("chunk boundary", "scatter race", "float32 accumulator", "dropped tail",
                  "permuted stride", "broadcast split", "unwritten edge")

TOOTHLESS = Mutant("relu_grad_scaled_by_1", ("relu",), "relu's gradient times 1.0: no bug",
                   scaled("relu", 1.0))


HALF_FUNCTIONS = ("widened", "store", "widened_copy", "in_ranges")  # 16-bit mutants patch


def registry_state():
    """Every op's backward rule, kernels dict and kernels, as objects; and the 16-bit
    machinery's functions (engine.backends.cpu.half, and the CPU backend's choice of a
    16-bit node's kernel) and the other replaceable helpers, under the name "half"."""
    state = {name: (op.backward, op.kernels, dict(op.kernels))
             for name, op in all_ops().items()}
    functions = {f: getattr(half, f) for f in HALF_FUNCTIONS}
    functions |= {f"{m.__name__}.{f}": getattr(m, f) for m, f in REPLACEABLE}
    functions["CpuBackend.kernel"] = type(CPU).kernel
    state["half"] = (None, None, functions)
    return state


def assert_same_objects(before, after):
    assert before.keys() == after.keys()
    for name, (backward, kernels, entries) in before.items():
        b2, k2, e2 = after[name]
        assert b2 is backward, f"{name}: backward rule not restored"
        assert k2 is kernels, f"{name}: kernels dict not restored"
        assert e2.keys() == entries.keys() and all(e2[k] is v for k, v in entries.items()), \
            f"{name}: a kernel was not restored"


def _by_tier(names):
    """Fast-tier mutants as they are, scale-tier ones (about a second each) marked slow."""
    return [pytest.param(n, marks=pytest.mark.slow) if MUTANTS[n].tier == "scale" else n
            for n in names]


@pytest.mark.parametrize("name", _by_tier(MUTANTS))
def test_every_mutant_is_caught(name):
    result = run_mutant(MUTANTS[name])
    assert result.status == "pass", result.message
    assert result.metrics["caught"] >= 1 and result.metrics["caught_by"]
    assert result.metrics["caught_in"] != "-" and result.metrics["check"] != "-"
    assert result.labels["tier"] == MUTANTS[name].tier


PRECISION_ONLY = ["store_truncates", "bf16_widened_wrong_shift", "store_ties_away",
                  "store_flushes_subnormals",
                  pytest.param("sum_f16_accumulated_in_f16", marks=pytest.mark.slow),
                  pytest.param("sum_rows_float32_accumulator", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", PRECISION_ONLY)
def test_the_precision_verdict_catches_what_the_fixed_tolerance_misses(name):
    """The 16-bit mutants (and the float32 accumulator): every case passes the fixed
    tolerances, torch and the numerical gradient; the precision verdict fails one."""
    result = run_mutant(MUTANTS[name])
    assert result.status == "pass", result.message
    assert result.metrics["fixed"] == "missed" and result.metrics["precision"] == "caught"
    assert result.metrics["check"] == "precision"


def test_the_16_bit_patches_touch_16_bit_nodes_only():
    """With sum's 16-bit kernel replaced, a float32 sum is the real one; a float16 sum
    over positive rows accumulates in float16 (it differs from the real one)."""
    case = next(c for c in get_op("sum").samples() if c.dtype == "f32")
    with MUTANTS["sum_f16_accumulated_in_f16"].patch():
        assert check_sample(case).status == "pass"
    x = np.random.default_rng(0).uniform(0.5, 1.0, (320, 8)).astype(np.float16)
    sum_op, exp_op = get_op("sum"), get_op("exp")
    f16, f32 = (np.dtype(np.float16),) * 2, (np.dtype(np.float32),) * 2
    real = CPU.kernel(sum_op, f16)
    with MUTANTS["sum_f16_accumulated_in_f16"].patch():
        mutated = CPU.kernel(sum_op, f16)
        assert CPU.kernel(sum_op, f32) is sum_op.kernels["cpu"]
        assert CPU.kernel(exp_op, f16).__name__ != "mutated"
    assert CPU.kernel(sum_op, f16) is real        # restored
    good, bad = np.empty(8, np.float16), np.empty(8, np.float16)
    real(good, [x], axes=(0,), keepdims=False)
    mutated(bad, [x], axes=(0,), keepdims=False)
    truth = x.astype(np.float64).sum(axis=0)
    assert np.abs(good - truth).max() < np.abs(bad - truth).max()
    assert np.array_equal(bad, np.add.accumulate(x, axis=0, dtype=np.float16)[-1])


def test_a_scale_mutant_is_caught_by_a_scale_case():
    m = MUTANTS["sum_runs_split_drops_tail"]
    result = run_mutant(m)
    assert result.status == "pass", result.message
    assert result.labels == {"ops": "sum", "kind": "dropped tail", "tier": "scale"}
    assert result.metrics["caught_in"] == "sum(type=f32,x=[1031,1031],axis=1,keepdims=True)"
    assert result.metrics["check"].startswith("forward")     # a NaN the split left


def test_the_mutants_cover_every_required_kind_in_both_tiers():
    assert len(MUTANTS) >= 25
    assert all(m.kind in KINDS and m.kind != "control" for m in MUTANTS.values())
    assert all(m.tier in TIERS and not m.control for m in MUTANTS.values())
    assert set(REQUIRED_KINDS) <= {m.kind for m in MUTANTS.values()}
    assert {m.tier for m in MUTANTS.values()} == set(TIERS)
    assert CONTROL.control and CONTROL.kind == "control" and CONTROL.name not in MUTANTS


def test_scale_mutants_run_on_scale_cases_only():
    for m in MUTANTS.values():
        if m.tier != "scale":
            continue
        cases = mutant_cases(m)
        assert 1 <= len(cases) <= 2, m.name
        assert all(c.tier == "scale" and c.op in m.ops and m.where(c) for c in cases)


@pytest.mark.parametrize("name", ["sum_chunks_drop_tail", "get_rows_back_lost_updates",
                                  "split_chunk_ends_one_short"])
def test_the_fast_tier_cannot_see_a_scale_mutant(name):
    """Every fast-tier case of the op, both dtypes, passes with the bug in place: no small
    case takes the fast path the bug is in (that is what the scale tier is for)."""
    m = MUTANTS[name]
    fast = dataclasses.replace(m, tier="fast", where=lambda case: True, max_cases=1000)
    cases = mutant_cases(fast, ("f32", "f64"))
    survived = run_mutant(fast, cases)
    assert survived.status == "fail" and survived.metrics["caught"] == 0
    assert survived.metrics["cases"] >= 20 and "SURVIVED" in survived.message


def test_an_unwritten_edge_shows_only_on_garbage():
    """pad_border_unwritten is right on a zeroed buffer and wrong on a reused one: gradcheck
    poisons the engine's memory (NaN) so that it shows."""
    x = np.arange(6.0).reshape(2, 3)
    pads = ((1, 0), (0, 2))
    kernel = pad_border_unwritten(get_op("pad").kernels["cpu"])
    fresh, reused = np.zeros((3, 5)), np.full((3, 5), np.nan)
    for out in (fresh, reused):
        kernel(out, [x], pads=pads)
    assert np.array_equal(fresh, np.pad(x, pads))
    assert np.isnan(reused).sum() == 15 - 6 and np.array_equal(reused[1:, :3], x)


def test_control_passes_where_it_runs():
    """The control on its fast cases and one scale case (a thread split re-made by the
    machinery): not flagged, so its row passes."""
    cases = [c for c in mutant_cases(CONTROL) if c.tier == "fast" or c.op == "sub"]
    result = run_mutant(CONTROL, cases)
    assert result.status == "pass", result.message
    assert result.metrics["caught"] == 0 and result.metrics["check"] == "not flagged"
    assert result.labels["kind"] == "control" and "as it must be" in result.message


@pytest.mark.slow
def test_control_passes_every_case():
    result = run_mutant(CONTROL)
    assert result.status == "pass", result.message
    assert result.metrics["cases"] >= 3 and result.metrics["caught"] == 0


def test_a_control_that_changes_results_fails():
    buggy = dataclasses.replace(CONTROL, name="control_with_a_bug",
                                patch=MUTANTS["relu_grad_scaled"].patch)
    case = mutant_cases(MUTANTS["relu_grad_scaled"])[0]
    result = run_mutant(buggy, [case])
    assert result.status == "fail" and "CONTROL FLAGGED" in result.message
    assert power([result, run_mutant(MUTANTS["relu_grad_scaled"], [case])]) == 1.0


@pytest.mark.parametrize("name", [*MUTANTS, CONTROL.name])
def test_mutant_patches_and_restores_the_registry(name):
    mutant = MUTANTS.get(name, CONTROL)
    before = registry_state()
    with mutant.patch():
        during = registry_state()
        assert any(during[op][:2] != before[op][:2] for op in before) or \
            during["half"][2] != before["half"][2], "patch changed nothing"
    assert_same_objects(before, registry_state())


@pytest.mark.parametrize("name", [*MUTANTS, CONTROL.name])
def test_registry_restored_after_an_error(name):
    before = registry_state()
    with pytest.raises(RuntimeError, match="boom"), MUTANTS.get(name, CONTROL).patch():
        raise RuntimeError("boom")
    assert_same_objects(before, registry_state())


def test_registry_restored_after_an_error_inside_a_mutated_kernel():
    """A kernel mutant whose kernel raises while the plan runs: the check is an error row,
    and the registry is whole again afterwards."""
    def broken(real):
        def kernel(out, ins, **params):
            raise RuntimeError("kernel boom")
        return kernel
    before = registry_state()
    m = Mutant("tanh_kernel_raises", ("tanh",), "raises", lambda: kernel_replaced(
        "tanh", broken), kind="dropped tail")
    result = run_mutant(m)
    assert result.status == "pass" and result.metrics["check"] == "error"
    assert_same_objects(before, registry_state())


def test_toothless_mutant_is_reported_not_caught():
    result = run_mutant(TOOTHLESS)
    assert result.status == "fail"
    assert result.metrics["caught"] == 0 and result.metrics["cases"] >= 1
    assert "SURVIVED" in result.message


def test_run_self_test_one_result_per_mutant_and_power():
    results = run_self_test(mutants=[TOOTHLESS, MUTANTS["relu_grad_scaled"]])
    assert [r.name for r in results] == ["relu_grad_scaled_by_1", "relu_grad_scaled"]
    assert [r.status for r in results] == ["fail", "pass"]
    assert results[1].labels["ops"] == "relu"
    assert results[1].metrics["caught_by"].startswith("numerical")
    assert power(results) == 0.5


def test_mutant_without_cases_is_an_error():
    nothing = Mutant("never_exercised", ("relu",), "no case fits", scaled("relu", 2.0),
                     where=lambda case: False)
    result = run_mutant(nothing)
    assert result.status == "error" and "no sample case" in result.message


def test_cases_follow_where_and_extra():
    m = MUTANTS["im2col_back_ignores_dilation"]
    cases = mutant_cases(m, ("f32", "f64"), max_cases=5)
    assert cases and all(c.op in m.ops and m.where(c) for c in cases)
    assert {c.dtype for c in cases} == {"f32", "f64"}
    add_cases = [str(c) for c in mutant_cases(MUTANTS["add_broadcast_wrong_axis"])]
    assert add_cases[-1] == "add(type=f64,a=[3,3],b=[3,1])"
    relu = MUTANTS["relu_grad_scaled"]
    assert len(mutant_cases(relu)) == relu.max_cases          # smallest first, a few per op


def test_a_backward_that_ignores_its_gradients_strides_needs_the_cotangent_cases():
    """ggml's pool_2d bug as a mutant of our pool_2d_back kernel: every plain registry case
    of pool_2d lets it through; the cotangent=permuted case catches it."""
    import dataclasses
    m = MUTANTS["pool_back_reads_gradient_as_contiguous"]
    assert run_mutant(m).status == "pass"
    plain = dataclasses.replace(m, name="plain cases only", cotangents=False,
                                where=lambda case: True, max_cases=100)
    survived = run_mutant(plain)
    assert survived.status == "fail" and survived.metrics["caught"] == 0
    assert survived.metrics["cases"] >= 10


def test_caught_by_reads_the_failing_check():
    def r(status, message):
        return Result("gradcheck", "case", status, message=message)
    assert caught_by(r("pass", "")) == []
    assert caught_by(r("fail", "numerical: backprop of x is off; worst x[1]: num 1, bp 2")) \
        == ["numerical"]
    assert caught_by(r("fail", "torch: x: torch disagrees; NaN/Inf: x has 2 non-finite")) \
        == ["torch", "NaN/Inf"]
    assert caught_by(r("error", "error: ShapeError: reshape: cannot reshape")) == ["shape check"]
    assert caught_by(r("error", "error: unexpected IndexError: out of range")) == ["error"]
    assert caught_by(r("fail", "x: 3/10 off, backprop 1, numerical 2")) == ["numerical"]
    # the scale tier's problems (gradcheck.scale)
    assert caught_by(r("fail", "forward: 1/1 off vs torch f64, worst out[]: ref 1, got 2; "
                               "precision: output errs 0.7 against float64")) \
        == ["forward", "precision"]
    assert caught_by(r("fail", "vjp: x 3/9 off vs plain f64, worst x[0]: ref 1, got 2; "
                               "directions: backprop off along 3/3 directions; threads: "
                               "output at 2 threads differs; nondeterministic: two runs")) \
        == ["vjp", "directions", "threads", "nondeterministic"]


def test_inject_accepts_a_mutant_name():
    assert parse("softmax_back_no_subtraction") == ("softmax_back_no_subtraction", None)
    assert parse("scale:1.05") == ("scale", 1.05)
    for bad in ("relu_grad_scaled:2", "flip", "scale:x"):
        with pytest.raises(ValueError):
            parse(bad)
    before = registry_state()
    with injected("log_softmax_drops_normaliser", ["relu"]):
        assert all_ops()["log_softmax"].backward is not before["log_softmax"][0]
    assert_same_objects(before, registry_state())


def test_check_sample_with_an_injected_mutant_fails():
    case = mutant_cases(MUTANTS["log_softmax_drops_normaliser"])[0]
    assert check_sample(case).status == "pass"
    assert check_sample(case, inject="log_softmax_drops_normaliser").status == "fail"


def test_the_mutation_score_counts_per_op_and_tier():
    from gradcheck.selftest import mutation_score
    from reports import Result
    rows = [Result("gradcheck-selftest", "control", "pass", labels={"ops": "sum",
                                                                     "kind": "control"}),
            Result("gradcheck-selftest", "a", "pass", labels={"ops": "sum, mul", "tier": "fast"}),
            Result("gradcheck-selftest", "b", "fail", labels={"ops": "sum", "tier": "scale"}),
            Result("gradcheck-selftest", "c", "pass", labels={"ops": "sum", "tier": "scale"})]
    assert mutation_score(rows) == {
        "mul": {"mutants": 1, "caught": 1, "fast": "1/1"},
        "sum": {"mutants": 3, "caught": 2, "fast": "1/1", "scale": "1/2"}}
