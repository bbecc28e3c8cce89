"""CUDA kernels of the reductions and row-wise ops against the CPU kernels: sum (and mean,
sum_rows, its composites), softmax (with ALiBi and sinks), softmax_back, softmax_sink_back,
log_softmax, log_softmax_back, cross_entropy_loss(_back),
argmax, norm(_back), rms_norm(_back).

Every registry sample's graph is replayed kernel by kernel (kernel_harness.replay). Under
the simulator every barrier costs milliseconds, so float64 keeps only the cases with a
strided input (a permuted view or a broadcast mask) and the first case of each op; float32
keeps all; float16 and bfloat16 the harness's selection (kernel_harness.half_selection).
Further tests reach what the samples do not: rows longer than a block, more rows than the
grid has row segments (and the same bits whatever the grid), argmax ties and NaNs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.registry import OPS
from tests.engine.backends.cuda.kernel_harness import (
    HALF_NAMES,
    cuda,
    cuda_cases,
    needs_cuda,
    replay,
    to_device,
)
from tests.engine.ops.op_harness import TOL

pytestmark = [pytest.mark.cudasim]
needs_cuda()

ROW_OPS = ("softmax", "softmax_back", "softmax_sink_back", "log_softmax", "log_softmax_back",
           "cross_entropy_loss", "cross_entropy_loss_back", "argmax", "norm", "norm_back",
           "rms_norm", "rms_norm_back")
# sample op -> the kernels its graphs are replayed for (a composite's graph holds sums; the
# loss every graph ends in is a sum too, left out of the row ops' replays to save time)
CHECKED = {"sum": {"sum"}, "mean": {"sum"}, "sum_rows": {"sum"}} | {op: set(ROW_OPS)
                                                                     for op in ROW_OPS}
MEAN_CASES = 2          # mean and sum_rows run the sum kernel on sum's shapes: a few suffice


def _strided(sample) -> bool:
    """A permuted input, or softmax's mask (read in place through its strides)."""
    return (any(spec.permute for spec in sample.inputs)
            or (sample.op == "softmax" and len(sample.inputs) > 1)
            or sample.op == "softmax_sink_back")


def _forward_only(sample):
    """A backward op's sample (no gradient of its own) with every input a plain input."""
    if OPS[sample.op].differentiable:
        return sample
    return dataclasses.replace(sample, inputs=tuple(dataclasses.replace(s, grad=False)
                                                    for s in sample.inputs))


def _cases():
    for op in CHECKED:
        samples = cuda_cases(OPS[op].samples())
        if op in ("mean", "sum_rows"):
            samples = [s for s in samples if s.dtype == "f32"][:MEAN_CASES] + \
                [s for s in samples if s.dtype == "f64" and _strided(s)][:MEAN_CASES] + \
                [s for s in samples if s.dtype in HALF_NAMES][:MEAN_CASES]
        else:
            first_f64 = next(s for s in samples if s.dtype == "f64")
            samples = [s for s in samples if s.dtype in ("f32", *HALF_NAMES) or _strided(s)
                       or s is first_f64]
        for s in samples:
            yield pytest.param(s, id=str(s))


@pytest.mark.parametrize("sample", list(_cases()))
def test_replay_matches_cpu(sample):
    checked = replay(_forward_only(sample), CHECKED[sample.op])
    own = "sum" if sample.op in ("mean", "sum_rows") else sample.op
    assert own in checked, f"{sample}: no {own} node was checked (got {checked})"


def compare(op: str, arrays, out_shape, out_dtype=None, **params):
    """The op's CUDA kernel on device copies of `arrays` equals its CPU kernel."""
    from engine.backends.cuda import resolve_kernel
    out_dtype = np.dtype(out_dtype or arrays[0].dtype)
    want = np.empty(out_shape, out_dtype)
    OPS[op].kernels["cpu"](want, arrays, **params)
    out = cuda.device_array(out_shape, out_dtype)
    resolve_kernel(OPS[op])(out, [to_device(a) for a in arrays], **params)
    got = out.copy_to_host()
    tol = TOL["f64" if out_dtype == np.float64 else "f32"] if out_dtype.kind == "f" else {}
    np.testing.assert_allclose(got, want, **tol, err_msg=op)
    return got


@pytest.fixture
def launch():
    """engine.backends.cuda.launch, with every kernel module of this family imported first
    (so that a patched limit is not copied into a module imported while patched)."""
    from engine.backends.cuda import launch, resolve_kernel
    for op in ("sum", *ROW_OPS):
        resolve_kernel(OPS[op])
    return launch


def test_rows_longer_than_a_block(launch, monkeypatch):
    """Rows of 21 elements with blocks capped at 8 threads (as rows of more than
    MAX_THREADS elements, at a simulator's cost): threads stride over their row 3 times."""
    monkeypatch.setattr(launch, "MAX_THREADS", 8)
    rng = np.random.default_rng(5)
    x = rng.uniform(-2.0, 2.0, (3, 21)).astype(np.float32)
    g = rng.uniform(-1.0, 1.0, (3, 21)).astype(np.float32)
    compare("sum", [x], (), axes=(0, 1), keepdims=False)
    compare("softmax", [x], x.shape, scale=0.7)
    compare("log_softmax", [x], x.shape)
    compare("log_softmax_back", [g, x - np.log(np.exp(x).sum(-1, keepdims=True))], x.shape)
    y = np.abs(x) + np.float32(0.1)             # rows off the simplex: renormalize divides
    compare("softmax_back", [g, y], x.shape, scale=0.7, renormalize=True)
    compare("norm_back", [g, x], x.shape, eps=1e-5)
    compare("rms_norm", [x], x.shape, eps=1e-6)
    compare("cross_entropy_loss", [x, np.abs(g) / np.abs(g).sum(-1, keepdims=True)], ())
    heads = [x.reshape(3, 1, 21), g[:1], np.float32([0.5, -1.0, 2.0])]  # mask, sinks
    compare("softmax", heads, (3, 1, 21), scale=0.7, max_bias=8.0)
    compare("softmax_sink_back", [g.reshape(3, 1, 21), *heads], (3,), scale=0.7, max_bias=8.0)
    x[1, 3] = x[1, 18] = x.max() + 1.0         # a tie between two threads' elements
    assert compare("argmax", [x], (3,), np.int32)[1] == 3


@pytest.mark.parametrize("op", ["softmax", "norm", "rms_norm_back", "sum", "softmax_sink_back"])
def test_more_rows_than_the_grid(op, launch, monkeypatch):
    """With one block allowed, its row segments step over all 40 rows (the last step has
    rows past the end, which must neither write nor divide by zero), and the result is the
    same bits as with a block per 32 rows (softmax_sink_back: per head): the grid never
    changes the order of additions."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-1.0, 1.0, (40, 3))
    cases = {"softmax": ([x], x.shape, {"scale": 1.0}),
             "norm": ([x], x.shape, {"eps": 0.0}),
             "rms_norm_back": ([rng.uniform(-1.0, 1.0, x.shape), x], x.shape, {"eps": 0.0}),
             "sum": ([x.T], (3,), {"axes": (1,), "keepdims": False}),   # a strided input
             # 5 heads of 8 rows: one block takes every head in turn
             "softmax_sink_back": ([rng.uniform(-1.0, 1.0, (5, 8, 3)), x.reshape(5, 8, 3),
                                    rng.uniform(-3.0, 0.0, (8, 3)), rng.uniform(-1, 1, (5,))],
                                   (5,), {"scale": 0.5, "max_bias": 2.0})}
    arrays, shape, params = cases[op]
    many_blocks = compare(op, arrays, shape, **params)
    monkeypatch.setattr(launch, "MAX_ROW_BLOCKS", 1)
    one_block = compare(op, arrays, shape, **params)
    assert one_block.tobytes() == many_blocks.tobytes()


def test_argmax_first_index_on_ties_and_nan():
    """Ties go to the lowest index, a NaN beats every number and the first NaN wins,
    wherever the elements fall among the threads of a row."""
    x = np.zeros((5, 9))
    x[0] = 1.0                                  # all equal: index 0
    x[1, [2, 7]] = 5.0                          # tie between two threads: 2
    x[2, [6, 4]] = np.nan                       # first NaN: 4
    x[3] = -np.inf                              # all -inf: 0
    x[4, [8, 1]] = [np.inf, np.inf]             # tie of infinities: 1
    got = compare("argmax", [x], (5,), np.int32)
    assert got.tolist() == [0, 2, 4, 0, 1]


def test_strided_rows_are_refused():
    """The row kernels read C-contiguous rows (the ops insert cont): a strided view is an
    error naming its strides, never a wrong answer."""
    from engine.backends.cuda import resolve_kernel
    from engine.errors import BackendError
    x = to_device(np.ones((4, 3)).T)
    out = cuda.device_array((3, 4))
    with pytest.raises(BackendError, match="C-contiguous"):
        resolve_kernel(OPS["softmax"])(out, [x], scale=1.0)
