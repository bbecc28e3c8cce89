"""engine.backends.cpu.pad: pad's one-pass kernel (each output row written once, in ranges
of rows on the engine's threads) gives numpy's np.pad, the bits of its plain twin (zero the
output, copy x into its interior) and the same bits at every thread count."""

from __future__ import annotations

import contextlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backends.cpu import paths, threads
from engine.backends.cpu.pad import cpu_pad
from tests.engine.backends.cpu.test_paths import _case, _run


@contextlib.contextmanager
def _split_small(n):
    """Kernels bound in the block split into n ranges, however small their work."""
    before, least = threads.get_num_threads(), threads.MIN_ELEMENTS
    threads.set_num_threads(n)
    threads.MIN_ELEMENTS = 0
    try:
        yield
    finally:
        threads.set_num_threads(before)
        threads.MIN_ELEMENTS = least


def _padded(x, pads, plain=False):
    out = np.full(tuple(b + n + a for n, (b, a) in zip(x.shape, pads, strict=True)), np.nan,
                  x.dtype)          # garbage where the kernel would leave a hole
    if plain:
        with paths.plain():
            cpu_pad(out, [x], pads=pads)
    else:
        cpu_pad(out, [x], pads=pads)
    return out


@st.composite
def _inputs(draw):
    ndim = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in shape)
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1.0
    perm = draw(st.permutations(range(ndim)))
    step = draw(st.sampled_from([1, 2]))
    x = x.transpose(perm)[..., ::step]       # permuted, strided views too
    return x, pads[:x.ndim]


@settings(max_examples=150, deadline=None)
@given(inputs=_inputs(), n=st.integers(1, 4))
def test_np_pad_and_the_plain_twin_at_every_thread_count(inputs, n):
    x, pads = inputs
    with _split_small(n):
        got = _padded(x, pads)
    np.testing.assert_array_equal(got, np.pad(x, pads))
    np.testing.assert_array_equal(got, _padded(x, pads, plain=True))


def test_the_scale_case_splits_and_plain_mode_does_not():
    case = _case("pad", "pad")
    assert _run(case)["split:cpu_pad"] > 0
    with paths.plain():
        assert not _run(case)


def test_an_output_view_is_written_where_it_lies():
    """An output that is not C-contiguous (never one of the engine's buffers) is written
    in place, by the plain twin."""
    x = np.arange(12.0).reshape(3, 4)
    pads = ((1, 0), (2, 1))
    base = np.full((7, 4), np.nan)
    out = base.T                         # (4, 7), a transposed view
    cpu_pad(out, [x], pads=pads)
    np.testing.assert_array_equal(base.T, np.pad(x, pads))
