"""The CPU backend's fast paths: each is taken by the scale case that is there for it, and
plain mode takes none of them (engine.backends.cpu.paths).

A fast path that no case reaches is never checked: for every family of paths.KNOWN, the
scale case named below must record it when the engine runs its forward and backward pass
(at 3 threads, so that the result does not depend on this machine's cores), and the same
case in plain mode must record nothing."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cpu import jit, paths
from engine.backends.cpu.vector_unary import FAST
from engine.registry import get_op
from gradcheck.adapters.engine_adapter import EngineAdapter, engine_thread_count, weighted_graph
from gradcheck.backprop import loss_weights

# family -> (op, a substring of the scale case that must take it)
REACHED_BY = {
    "split": ("relu", "relu(type=f32,x=[1031,1031])"),
    "matmul:sparse": ("matmul", "a=[1000,784]"),
    "matmul:blas_chunks": ("matmul", "a=[257,263],b=[263,251])"),
    "copy:tiled": ("cont", "x=[1031,1031]perm[1,0]"),
    "copy:streaming": ("concat", "a=[2048,2063]"),
    "pool_2d:tiled": ("pool_2d", "kernel=[2,2],mode=max"),
    "pool_2d_back:tiled": ("pool_2d", "kernel=[2,2],mode=max"),
    "im2col_back:scatter": ("conv_transpose_2d", "x=[4,16,64,64]"),
    "conv_2d:columns": ("conv_2d", "x=[8,8,64,64]"),
    "im2col:rows": ("im2col", "layout=NKHW"),
    "im2col_back:rows": ("im2col", "layout=NKHW"),
    "sum:chunks": ("sum", "axis=None"),
    "sum:chunks_split": ("sum", "axis=None"),
    "sum:rows": ("sum", "x=[1500007,3]"),
    "sum:runs": ("sum", "x=[1031,1031],axis=1"),
    "sum:runs_split": ("sum", "x=[1031,1031],axis=1"),
    "sum:runs_grouped": ("sum", "x=[547,16,11,11]"),
    "sum:lanes": ("sum", "type=bf16,x=[1031,1031],axis=1"),
    "broadcast:streaming": ("broadcast_to", "x=[1],shape=[2048,2063]"),
    "get_rows_back:bands": ("get_rows", "table=[1031,1031],idx"),
    "parallel": ("relu", "relu(type=f32,x=[1031,1031])"),
    "vector": ("gelu", "gelu(type=f32,x=[1031,1031])"),
    "half": ("relu", "relu(type=f16,x=[1031,1031])"),
    "stream": ("sgn", "sgn(type=f32,x=[2048,2063])"),
    "widen:scratch": ("matmul", "matmul(type=bf16,a=[523,1031]"),
    "widen:fused": ("matmul", "matmul(type=bf16,a=[523,1031]"),
    "attention:tiles": ("attention", "mask=[131,263]"),
    "attention:causal_skip": ("attention", "type=f32,q=[1,4,257,64]"),
    "attention:compiled": ("attention", "q=[2,2,300,64]"),
    "attention:head_tasks": ("attention", "type=f32,q=[1,4,257,64]"),
}


def _case(op: str, text: str):
    cases = [c for c in get_op(op).scale() if text in str(c)]
    assert cases, f"no scale case of {op} contains {text!r}"
    return cases[0]


def _run(case):
    """The case's forward and backward pass in our engine (at 3 threads), recording."""
    arrays = case.generate_inputs()
    with engine_thread_count(3), paths.recording() as taken:
        _vjp(case, arrays)
    return taken


def _vjp(case, arrays):
    out = weighted_graph(case, arrays, as_params=False)[1]
    EngineAdapter().vjp(case, arrays, loss_weights(out.shape, 0))


def test_the_sparse_product_takes_both_splits():
    """Row and column splits of the zero-skipping product are different code: a scale case
    takes each (the column split on an operand whose zeros fill whole columns)."""
    rows = _run(_case("matmul", "a=[1000,784]"))
    cols = _run(_case("matmul", "a=[1000,783]"))
    assert any(p.startswith("matmul:sparse_left/rows") for p in rows), sorted(rows)
    assert any(p.startswith("matmul:sparse_left/cols") for p in cols), sorted(cols)


def test_every_family_is_reached_by_a_named_case():
    assert set(REACHED_BY) == set(paths.KNOWN)


@pytest.mark.parametrize("family", [f for f in REACHED_BY if f != "parallel"])
def test_the_scale_case_takes_the_path(family):
    op, text = REACHED_BY[family]
    taken = _run(_case(op, text))
    assert family in {paths.family(p) for p in taken}, sorted(taken)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_softmax_rows_split_forward_and_backward(dtype):
    """softmax's kernels split their rows on the engine's threads (split:cpu_softmax and
    split:cpu_softmax_back), in float32 and in the 16-bit kernels that read patterns."""
    taken = _run(_case("softmax", f"softmax(type={dtype},x=[1031,1031],scale=1"))
    assert taken["split:cpu_softmax"] > 0 and taken["split:cpu_softmax_back"] > 0


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_a_16_bit_product_converts_on_the_engines_threads(dtype):
    """The 16-bit products of matmul's scale case (forward and both gradients) convert in
    BLAS's chunks (widen:fused: a's rows forward and g's for a's gradient, the rounding of
    every output, b's gradient's g shared in the chunks); the operands every chunk reads
    whole and of at least half.SPLIT_MIN_ELEMENTS (b forward, its and a's transposed views
    backward) are widened before, in ranges on the engine's threads (split:half_widen);
    plain mode converts in one range."""
    case = _case("matmul", f"matmul(type={dtype},a=[523,1031]")
    taken = _run(case)
    assert taken["widen:fused"] == 3 and taken["split:half_widen"] >= 3, sorted(taken)
    assert taken["matmul:blas_chunks"] > 0, sorted(taken)
    with paths.plain():
        assert not _run(case)


@pytest.mark.parametrize("op", ["log_softmax", "cross_entropy_loss"])
def test_row_losses_split_forward_and_backward(op):
    """log_softmax's and cross_entropy_loss's kernels and their backward ops' run as ranges
    of rows (the loss: of its chunks of rows) on the engine's threads."""
    taken = _run(get_op(op).scale()[0])
    assert taken[f"split:cpu_{op}"] > 0 and taken[f"split:cpu_{op}_back"] > 0, sorted(taken)


@pytest.mark.parametrize("op", ["broadcast_to", "sum"])
def test_a_broadcast_back_to_the_summed_shape_splits(op):
    """broadcast_to, which sum's gradient is, writes big outputs in chunks on the engine's
    threads: a row broadcast and a single element (the gradient of a sum over all axes)."""
    assert _run(get_op(op).scale()[0])["split:cpu_broadcast_to"] > 0


@pytest.mark.parametrize("text", ["mask=[206,1031],sinks=[5],max_bias=8",
                                  "mask=[1],sinks=[5]"])
def test_softmax_with_alibi_and_sinks_splits_its_rows(text):
    """softmax with a mask (ALiBi's slopes, sinks) and the sinks' gradient run as ranges of
    rows on the engine's threads (split:cpu_softmax_masked, split:cpu_softmax_sink_back),
    the ranges ending inside a head."""
    taken = _run(_case("softmax", text))
    assert taken["split:cpu_softmax_masked"] > 0 and taken["split:cpu_softmax_sink_back"] > 0


@pytest.mark.parametrize("text", ["type=f32,q=[1,4,257,64]", "mask=[131,263]",
                                  "q=[2,2,300,64]"])
def test_attention_splits_forward_and_backward(text):
    """attention's kernels run (batch, head) pairs (backward: (batch, kv head) pairs) on
    the engine's threads, and take query blocks, in every scale case."""
    taken = _run(_case("attention", text))
    assert taken["split:cpu_attention_fwd"] > 0 and taken["split:cpu_attention_back"] > 0
    assert taken["attention:tiles"] > 0 and taken["attention:compiled"] > 0


def test_concat_along_a_later_axis_splits_its_rows_and_along_the_first_runs_whole():
    """concat's rows side by side (split:cpu_concat) where a and b run along out's axis 0;
    along axis 0 they do not, and the kernel runs whole."""
    later, first = (_case("concat", f"axis={axis}") for axis in (1, 0))
    assert _run(later)["split:cpu_concat"] > 0
    assert "split:cpu_concat" not in _run(first)


def test_a_transposed_result_is_copied_in_tiles():
    """transpose's scale case: its view's gradient (a transposed view of the upstream
    gradient) is copied into the gradient's buffer by cont's tiled kernel (the executor's
    view copy, CpuBackend.bind_copy); plain mode copies it by numpy."""
    case = _case("transpose", "transpose")
    assert _run(case)["copy:tiled"] > 0
    with paths.plain():
        assert not _run(case)


@pytest.mark.parametrize("op", ["norm", "rms_norm"])
def test_norms_run_in_ranges_of_rows(op):
    """The scale cases of norm and rms_norm split the op and its backward op into ranges
    of rows on the threads; plain mode runs them in one range."""
    case = _case(op, op)
    taken = _run(case)
    assert taken[f"split:cpu_{op}"] > 0 and taken[f"split:cpu_{op}_back"] > 0
    with paths.plain():
        assert not _run(case)


@pytest.mark.parametrize("op", sorted(FAST))
def test_each_vector_op_takes_its_vector_kernels_at_scale(op):
    """Every op with vectorised float32 math runs it in its scale case, forward and (where
    it has a one-pass gradient op) backward; plain mode runs the row's math instead."""
    case = get_op(op).scale()[0]
    taken = _run(case)
    assert taken[f"vector:{op}"] > 0, sorted(taken)
    if FAST[op].gradient is not None:
        assert taken[f"vector:{op}_back"] > 0, sorted(taken)
    with paths.plain():
        assert not _run(case)


@pytest.mark.parametrize("op", ["gelu", "sin", "sigmoid", "silu", "gelu_erf", "softplus",
                                "tanh", "elu"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_scale_cases_take_the_native_vector_kernels(op, dtype):
    """The activations' vector kernels read 16-bit patterns themselves (no widening): the
    16-bit scale cases of gelu and sin take them, and those of the ops whose 16-bit math is
    float32's (vector_unary's forward16), split over the threads; plain mode takes the
    widened float32 kernel of the row's math."""
    case = _case(op, f"type={dtype},")
    taken = _run(case)
    assert taken[f"vector:{op}"] > 0 and taken[f"vector:{op}_back"] > 0, sorted(taken)
    assert taken[f"split:cpu_{op}"] > 0, sorted(taken)
    with paths.plain():
        assert not _run(case)


def test_numba_parallel_compilations_are_reached_when_turned_on(monkeypatch):
    monkeypatch.setattr(jit, "PARALLEL", True)
    op, text = REACHED_BY["parallel"]
    taken = _run(_case(op, text))      # its loss's whole-tensor sum has a prange loop
    assert taken["parallel"] > 0


@pytest.mark.parametrize("family", ["split", "matmul:sparse", "copy:tiled", "pool_2d:tiled",
                                    "sum:rows", "get_rows_back:bands",
                                    "attention:causal_skip", "attention:compiled", "vector",
                                    "half", "widen:fused"])
def test_plain_mode_takes_no_fast_path(family):
    op, text = REACHED_BY[family]
    case = _case(op, text)
    with paths.plain():
        taken = _run(case)
    assert not taken, sorted(taken)


def test_plain_mode_is_restored_after_an_error():
    with pytest.raises(RuntimeError), paths.plain():
        raise RuntimeError
    assert paths.PLAIN is False


def test_poisoned_arenas_hold_nan():
    from engine.backends.cpu import CPU
    with paths.poisoned():
        arena = CPU.alloc(64)
    assert np.isnan(arena.view(np.float32)).all()
    assert paths.POISON is False


def test_family_names():
    assert paths.family("split:cpu_relu") == "split"
    assert paths.family("matmul:sparse_left/rows+blas") == "matmul:sparse"
    assert paths.family("sum:rows") == "sum:rows"
    assert paths.family("vector:gelu_back") == "vector"
    assert paths.family("half:relu_back") == "half"


def test_nested_recordings_end_in_any_state_of_their_counts():
    # Counters compare by their counts: an inner recording equal to the outer one when it
    # ends must take itself out, not its twin (the scale tier records inside a recording)
    with paths.recording() as outer:
        with paths.recording() as inner:
            paths.taken("split:cpu_relu")
        paths.taken("split:cpu_relu")
    assert outer["split:cpu_relu"] == 2 and inner["split:cpu_relu"] == 1
    paths.taken("split:cpu_relu")
    assert outer["split:cpu_relu"] == 2
