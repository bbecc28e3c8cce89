"""CUDA kernels of concat, pad, set, acc, repeat and repeat_back against the CPU kernels.

Every registry sample of these ops (and of block, whose backward is pad) is replayed: each
kernel node of its forward and backward graph runs on the CUDA backend on the inputs the
CPU computed, strided views included, and must give the CPU kernel's result.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import BackendError
from engine.registry import OPS
from tests.engine.backends.cuda.kernel_harness import cuda, cuda_cases, needs_cuda, replay_family

pytestmark = [pytest.mark.cudasim]

FAMILY = {"concat", "pad", "set", "acc", "repeat", "repeat_back"}

# the kernel ops each sample's graph must exercise (forward, then backward)
EXPECTED = {"concat": {"concat"}, "pad": {"pad"}, "set": {"set"}, "acc": {"acc"},
            "repeat": {"repeat", "repeat_back"}, "repeat_back": {"repeat_back", "repeat"},
            "block": {"pad"}}

SAMPLES = [s for name in EXPECTED for s in cuda_cases(OPS[name].samples())]


needs_cuda()


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
def test_kernels_match_cpu(sample):
    replay_family(sample, FAMILY, EXPECTED)


def _run(kernel, out_shape, ins, **params):
    """A CUDA kernel's result on host arrays `ins` (uploaded as they are)."""
    out = cuda.device_array(out_shape, ins[0].dtype)
    kernel(out, [cuda.to_device(a) for a in ins], **params)
    return out.copy_to_host()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeat_back_is_bitwise_the_cpu_sum(dtype):
    """Many tiles of values of mixed magnitude: the same summation order gives the same
    bits, not just close values."""
    from engine.backends.cpu.repeat import cpu_repeat_back
    from engine.backends.cuda.indexing import cuda_repeat_back
    rng = np.random.default_rng(5)
    g = (rng.standard_normal((4, 3, 6, 5)) * 10.0 ** rng.integers(-4, 5, (4, 3, 6, 5)))
    g = g.astype(dtype)
    want = np.empty((2, 3, 2, 5), dtype)
    cpu_repeat_back(want, [g], shape=want.shape)
    first = _run(cuda_repeat_back, want.shape, [g], shape=want.shape)
    again = _run(cuda_repeat_back, want.shape, [g], shape=want.shape)
    assert first.tobytes() == want.tobytes() == again.tobytes()


def test_more_than_four_axes_is_a_clear_error():
    from engine.backends.cuda.indexing import cuda_pad
    x = np.zeros((1, 1, 1, 1, 2), np.float32)
    with pytest.raises(BackendError, match=r"pad: .* at most 4 axes.*\[1, 1, 1, 1, 2\]"):
        _run(cuda_pad, (1, 1, 1, 1, 4), [x], pads=((0, 0),) * 4 + ((1, 1),))


def test_every_kernel_has_a_ptx_signature_per_dtype():
    from engine.backends.cuda import indexing
    kernels = {name for name, v in vars(indexing).items()    # its own, not launch's helpers
               if hasattr(v, "py_func") and v.py_func.__module__ == indexing.__name__}
    listed = {(k.py_func.__name__, dt) for k, sig in indexing.PTX_SIGNATURES
              for dt in ("float32", "float64") if dt in sig}
    assert listed == {(name, dt) for name in kernels for dt in ("float32", "float64")}
