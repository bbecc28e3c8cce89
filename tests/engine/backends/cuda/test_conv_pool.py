"""CUDA kernels of im2col, im2col_1d, conv_2d and pool_2d (and their backward ops) against
the CPU kernels.

Registry samples of these ops, and of the composites built from them (conv_transpose_2d,
pool_1d), are replayed: each kernel node of the forward and backward
graph runs on the CUDA backend on the inputs the CPU computed, strided views included, and
must give the CPU kernel's result. pool_2d has 160 samples; every fifth of its ggml-style
grid and all of its extra cases (tiled 2x2 windows, padding with stride 2, mixed kernel
sizes) keep the simulator run short. Max pooling's tie and NaN rules, which the samples
avoid (they pool distinct values), are checked directly.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.registry import OPS
from tests.engine.backends.cuda.kernel_harness import (
    CUDA_DTYPES,
    cuda,
    cuda_cases,
    needs_cuda,
    replay_family,
)

pytestmark = [pytest.mark.cudasim]

FAMILY = {"im2col", "im2col_back", "im2col_1d", "im2col_1d_back", "pool_2d", "pool_2d_back",
          "conv_2d", "conv_2d_back_x", "conv_2d_back_w"}
CONV = {"conv_2d", "conv_2d_back_x", "conv_2d_back_w"}

# the kernel ops of FAMILY each sample's graph must exercise (forward and backward)
EXPECTED = {"im2col": {"im2col", "im2col_back"},
            "im2col_1d": {"im2col_1d", "im2col_1d_back"},
            "im2col_1d_back": {"im2col_1d_back", "im2col_1d"},
            "pool_2d": {"pool_2d", "pool_2d_back"},
            "conv_2d": CONV, "conv_2d_back_x": CONV, "conv_2d_back_w": CONV,
            "conv_transpose_2d": {"im2col_back", "im2col"},
            "pool_1d": {"pool_2d", "pool_2d_back"}}

POOL_EXTRA_CASES = 4     # the cases after the grid, per dtype and mode (see engine/ops/pool_2d)


def _pool_2d_samples():
    """Every fifth grid case and every extra case, per dtype and mode."""
    groups: dict[tuple, list] = {}
    for s in cuda_cases(OPS["pool_2d"].samples()):
        groups.setdefault((s.dtype, s.kwargs["mode"]), []).append(s)
    return [s for group in groups.values()
            for s in group[:-POOL_EXTRA_CASES:5] + group[-POOL_EXTRA_CASES:]]


def _composite_samples(name, per_dtype):
    """The permuted samples of a composite, then its first others, `per_dtype` per dtype."""
    out = []
    for dtype in CUDA_DTYPES:
        mine = [s for s in cuda_cases(OPS[name].samples()) if s.dtype == dtype]
        permuted = [s for s in mine if any(i.permute for i in s.inputs)]
        out += (permuted + [s for s in mine if s not in permuted])[:per_dtype]
    return out


SAMPLES = (cuda_cases(OPS["im2col"].samples()) + cuda_cases(OPS["im2col_1d"].samples())
           + cuda_cases(OPS["im2col_1d_back"].samples()) + _pool_2d_samples()
           + _composite_samples("conv_2d", 3) + _composite_samples("conv_2d_back_x", 3)
           + _composite_samples("conv_2d_back_w", 3) + _composite_samples("conv_transpose_2d", 3)
           + _composite_samples("pool_1d", 4))


needs_cuda()


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_kernels_match_cpu(sample):
    replay_family(sample, FAMILY, EXPECTED)


def test_samples_cover_strided_inputs():
    """The replayed samples include permuted (strided) inputs of every op family."""
    permuted = {s.op for s in SAMPLES if any(i.permute for i in s.inputs)}
    assert {"im2col_1d", "im2col_1d_back", "conv_2d", "conv_transpose_2d",
            "pool_1d"} <= permuted


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel,stride,padding", [((3, 3), (1, 1), (1, 1)),
                                                   ((2, 2), (2, 2), (0, 0)),
                                                   ((3, 2), (2, 1), (1, 0))])
def test_max_pool_routes_ties_and_nan_like_cpu(dtype, kernel, stride, padding):
    """Small integers tie often and a NaN wins its windows: the forward output and the
    gradient (each window's g at its first cell equal to the max, or its first NaN;
    overlapping windows adding up) equal the CPU kernels' bit for bit."""
    from engine.backends.cpu.pool_2d import cpu_pool_2d, cpu_pool_2d_back
    from engine.backends.cuda.pool import cuda_pool_2d, cuda_pool_2d_back
    rng = np.random.default_rng(7)
    x = rng.integers(0, 3, (2, 2, 6, 5)).astype(dtype)
    x[0, 1, 2, 3] = x[1, 0, 4, 0] = np.nan
    params = dict(mode="max", kernel=kernel, stride=stride, padding=padding)
    oh = (6 + 2 * padding[0] - kernel[0]) // stride[0] + 1
    ow = (5 + 2 * padding[1] - kernel[1]) // stride[1] + 1
    y = np.empty((2, 2, oh, ow), dtype)
    cpu_pool_2d(y, [x], **params)
    g = rng.standard_normal(y.shape).astype(dtype)
    dx = np.empty_like(x)
    cpu_pool_2d_back(dx, [g, x, y], **params)

    y_dev = cuda.device_array(y.shape, dtype)
    cuda_pool_2d(y_dev, [cuda.to_device(x)], **params)
    dx_dev = cuda.device_array(x.shape, dtype)
    cuda_pool_2d_back(dx_dev, [cuda.to_device(a) for a in (g, x, y)], **params)
    assert np.isnan(y).any()
    assert y_dev.copy_to_host().tobytes() == y.tobytes()
    assert dx_dev.copy_to_host().tobytes() == dx.tobytes()
