"""The 16-bit kernels of the plain rows of engine.backends.cpu.elementwise.HALF_NATIVE (the
path `half:<op>`: relu and relu_back read and write 16-bit patterns in one pass): on all
2^16 patterns of each format, the bits of their plain twins, the float32 kernels widened
(half.widened), special values and signed zeros included; a strided input is gathered
first; the 16-bit scale cases take them and plain mode does not. And the vector maps of a
strided input, copied C-contiguous first, give the contiguous input's bits; the
16-bit vector kernels of float32 math, with the bare conversions, those of the fixed-up
ones. The plain rows' maps and cont's copies of big outputs, streamed, give the plain
twins' bits."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engine.backends.cpu import block, half, paths
from engine.backends.cpu import elementwise as cpu
from engine.backends.cpu.vector_unary import FAST
from engine.elementwise import UNARY
from engine.registry import get_op
from tests.engine.backends.cpu.test_paths import _run

DTYPES = pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])


def _every_pattern(dtype, shape=(256, 256)):
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).reshape(shape)


def _both(kernel, ins, dtype):
    """(the kernel's output, its plain twin's, the paths the first took)."""
    shape = ins[0].shape
    fast, plain = np.empty(shape, dtype), np.empty(shape, dtype)
    with paths.recording() as taken:
        kernel(fast, ins)
    with paths.plain():
        kernel(plain, ins)
    return fast, plain, taken


@DTYPES
def test_relu_of_every_pattern_is_the_widened_kernels(dtype):
    x = _every_pattern(dtype)
    fast, plain, taken = _both(cpu.unary("relu"), [x], dtype)
    assert taken["half:relu"] > 0, sorted(taken)
    assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))
    assert (fast.view(np.uint16)[x.astype(np.float32) > 0]
            == x.view(np.uint16)[x.astype(np.float32) > 0]).all()
    strided, _, taken = _both(cpu.unary("relu"), [x.T], dtype)   # gathered first
    assert taken["half:relu"] > 0
    assert np.array_equal(strided.view(np.uint16), fast.T.view(np.uint16))


@DTYPES
def test_relu_back_of_every_pattern_is_the_widened_kernels(dtype):
    """g every pattern against x every pattern in a shuffled order, and x against itself."""
    x = _every_pattern(dtype)
    g = np.random.default_rng(7).permutation(x.reshape(-1)).reshape(x.shape)
    for ins in ([g, x], [x, x]):
        fast, plain, taken = _both(cpu.binary("relu_back"), ins, dtype)
        assert taken["half:relu_back"] > 0, sorted(taken)
        assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))


@DTYPES
def test_relu_back_of_a_strided_input_takes_the_plain_kernel(dtype):
    x = _every_pattern(dtype)
    fast, plain, taken = _both(cpu.binary("relu_back"), [x, x.T], dtype)
    assert "half:relu_back" not in taken
    assert np.array_equal(fast.view(np.uint16), plain.view(np.uint16))


@pytest.mark.parametrize("text", ["type=f16", "type=bf16"])
def test_the_16_bit_scale_cases_of_relu_take_the_pattern_kernels(text):
    case = next(c for c in get_op("relu").scale() if text in str(c))
    taken = _run(case)
    assert taken["half:relu"] > 0 and taken["half:relu_back"] > 0, sorted(taken)
    with paths.plain():
        assert not _run(case)


@pytest.mark.parametrize("name", ["gelu_erf", "tanh", "sin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_a_strided_input_maps_to_the_contiguous_bits(name, dtype):
    """A strided x is copied C-contiguous and mapped from there (elementwise._mapped; sin
    by its reach template): forward and gradient, the bits of the same values read
    contiguous."""
    x = np.random.default_rng(5).uniform(-6.0, 6.0, (64, 96)).astype(dtype)
    g = np.random.default_rng(6).uniform(-1.0, 1.0, (96, 64)).astype(dtype)
    for kernel, ins in ((cpu.unary(name), lambda v: [v]),
                        (cpu.unary_back(name), lambda v: [g, v])):
        strided, contiguous = np.empty((96, 64), dtype), np.empty((96, 64), dtype)
        with paths.recording() as taken:
            kernel(strided, ins(x.T))
        kernel(contiguous, ins(np.ascontiguousarray(x.T)))
        assert any(p.startswith("vector:") for p in taken), sorted(taken)
        assert np.array_equal(strided.view(np.uint16 if dtype == np.float16 else np.uint32),
                              contiguous.view(np.uint16 if dtype == np.float16 else np.uint32))


def _float32_math_kernels(name: str, which: str, bare: bool):
    """{fmt: kernel}: op `name`'s 16-bit vector kernels of its float32 math (forward16 or
    gradient16), with the bare conversions (`bare`, elementwise._BARE16, what the op runs)
    or with value's and rounded's NaN fix-ups."""
    fast = FAST[name]
    if which == "forward":
        kernels = cpu._vector_kernels(cpu._vector_map, cpu._vector_map_reach, name,
                                      fast.forward, fast.reach, None, fast.forward16,
                                      "forward", bare=bare)
    else:
        kernels = cpu._vector_kernels(cpu._vector_gradient_map, cpu._vector_gradient_map_reach,
                                      name, fast.gradient, fast.reach, None, fast.gradient16,
                                      "gradient", bare=bare)
    return {fmt: kernels[fmt] for fmt in (half.F16, half.BF16)}


def _at(buffer_items: int, dtype, start: int):
    """A 1-D array of `buffer_items` - 64 elements of dtype starting `start` elements past a
    64-byte boundary (a view into a larger buffer)."""
    raw = np.empty(buffer_items * np.dtype(dtype).itemsize + 64, np.uint8)
    first = (-raw.ctypes.data) % 64 + start * np.dtype(dtype).itemsize
    return raw[first:first + (buffer_items - 64) * np.dtype(dtype).itemsize].view(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.uint16], ids=["f32", "16-bit"])
def test_the_head_runs_to_the_first_64_byte_boundary(dtype):
    per_line = 64 // np.dtype(dtype).itemsize
    for start in range(per_line):
        a = _at(1000, dtype, start)
        assert a.ctypes.data % 64 == start * np.dtype(dtype).itemsize
        assert cpu._to_line(a) == (per_line - start) % per_line
        assert cpu._to_line(a[:3]) == min(3, (per_line - start) % per_line)


@pytest.mark.parametrize("name", sorted(n for n, f in FAST.items() if f.gradient is not None))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_the_vector_maps_give_the_same_bits_at_every_alignment(name, dtype):
    """The vector maps start their loops at x's first 64-byte boundary (elementwise._to_line):
    x, g and out at every offset from one (and x apart from g and out) give the bits of the
    aligned arrays, forward and gradient, the head, the loop and its tail alike."""
    params = {k: 1.0 for k in UNARY[name].params}
    rng = np.random.default_rng(7)
    n = 1000 - 64
    xs = rng.uniform(-8.0, 8.0, n).astype(np.float32)
    xs[:8 * 37:37] = [0.0, -0.0, 1e-30, -1e-30, 50.0, -50.0, np.inf, -np.inf]
    gs = rng.uniform(-2.0, 2.0, n).astype(np.float32)
    bits = np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32
    results = {}
    for x_start, rest_start in [(0, 0)] + [(k, k) for k in range(1, 16)] + [(3, 0), (0, 5)]:
        x, g = _at(1000, dtype, x_start), _at(1000, dtype, rest_start)
        x[:], g[:] = xs.astype(dtype), gs.astype(dtype)
        forward, gradient = _at(1000, dtype, rest_start), _at(1000, dtype, rest_start)
        with paths.recording() as taken:
            cpu.unary(name)(forward, [x], **params)
            cpu.unary_back(name)(gradient, [g, x], **params)
        assert f"vector:{name}" in taken, sorted(taken)
        results[x_start, rest_start] = (forward.view(bits).copy(), gradient.view(bits).copy())
    for key, (forward, gradient) in results.items():
        assert np.array_equal(forward, results[0, 0][0]), (name, key)
        assert np.array_equal(gradient, results[0, 0][1]), (name, key)


# NaN patterns whose bits a fix-up keeps: float16's signalling and quiet NaNs of either sign
# and with payloads in the top and the bottom bits; bfloat16's the same
SPECIAL16 = {np.float16: (0x7C01, 0xFC01, 0x7D00, 0x7E00, 0xFE01, 0x7FFF, 0x7C00, 0xFC00,
                          0x0000, 0x8000, 0x3C00, 0xBC00, 0x0001, 0x4D00, 0xCD00, 0x7BFF),
             ml_dtypes.bfloat16: (0x7F81, 0xFF81, 0x7FA0, 0x7FC0, 0xFFC1, 0x7FFF, 0x7F80,
                                  0xFF80, 0x0000, 0x8000, 0x3F80, 0xBF80, 0x0001, 0x41A0,
                                  0xC1A0, 0x7F7F)}
FLOAT32_MATH = sorted(n for n, f in FAST.items() if f.forward16 is not None)


@DTYPES
@pytest.mark.parametrize("name", FLOAT32_MATH)
def test_bare_conversions_give_the_bits_of_the_fixed_up_ones(name, dtype):
    """The 16-bit kernels of float32 math load and store without the NaN fix-ups
    (elementwise._BARE16): on every pattern of x, forward and gradient (at each of
    SPECIAL16's g: signalling and quiet NaNs, infinities, zeros, numbers), and on every
    pattern of g against a shuffled x and against each of SPECIAL16's x, the bits of the
    same math loaded and stored with them (a NaN's up to its sign). Where g is a NaN and the
    math's value of x one too, which of the two NaNs a product returns is LLVM's choice (x86
    returns its first operand's, and the order of a multiplication's operands is free): the
    two kernels' scalar loops (a misaligned array's head and tail, elementwise._to_line)
    chose differently for gelu_erf's gradient, g's NaN against x's quieted one, so there
    both results need only be NaNs."""
    fmt = half.F16 if dtype == np.float16 else half.BF16
    nan = np.uint16(0x7C00 if dtype == np.float16 else 0x7F80)
    is_nan = lambda p: (p & np.uint16(0x7FFF)) > nan  # noqa: E731
    params = UNARY[name].kernel_args(name, {k: 1.0 for k in UNARY[name].params})
    x = _every_pattern(np.uint16).reshape(-1)
    shuffled = np.random.default_rng(11).permutation(x)
    specials = np.array(SPECIAL16[dtype], np.uint16)
    ins = [(x,)]
    ins += [(np.full_like(x, s), x) for s in specials]
    ins += [(x, shuffled), (x, x)] + [(x, np.full_like(x, s)) for s in specials]
    for which in ("forward", "gradient"):
        bare = _float32_math_kernels(name, which, True)[fmt]
        fixed = _float32_math_kernels(name, which, False)[fmt]
        for args in ins:
            if len(args) != (1 if which == "forward" else 2):
                continue
            got, want = np.empty_like(x), np.empty_like(x)
            bare(*args, got, params)
            fixed(*args, want, params)
            two_nans = (is_nan(args[0]) & is_nan(got) & is_nan(want) if len(args) == 2
                        else np.zeros(x.shape, bool))
            # a NaN's sign is the compiler's choice too (on an AVX2 target the bare
            # kernels' gelu_erf and silu returned a NaN x with its sign flipped, at
            # f16f1b4 already): NaNs compare up to their sign
            sign = np.where(is_nan(want), np.uint16(0x7FFF), np.uint16(0xFFFF))
            got, want = got & sign, want & sign
            i = int(np.argmax((got != want) & ~two_nans))
            assert np.array_equal(got[~two_nans], want[~two_nans]), (
                f"{name} {which}: {got[i]:#06x} where the fix-ups give {want[i]:#06x} at "
                f"{[hex(a[i]) for a in args]}")


# --- the plain rows' streaming maps (stream:<op>) and cont's streamed copy (copy:streaming) --
STREAMED = ["sgn", "neg", "scale", "sqr", "abs", "step"]


@pytest.mark.parametrize("name", STREAMED)
@pytest.mark.parametrize("size", [1, 15, 4096, 4111, 3 * 4096 + 17])
def test_the_streaming_map_gives_the_plain_maps_bits_and_writes_nothing_around(
        name, size, monkeypatch):
    """Every size streams (STREAM_MIN_BYTES 0): out starting at each float32 offset from a
    64-byte boundary (the head loop's length), the blocks and the ragged last one, special
    values and signed zeros among the inputs; the elements around out untouched."""
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(block, "STREAM_MIN_RUN", 0)
    kernel = get_op(name).kernels["cpu"]
    rng = np.random.default_rng(size)
    x = (rng.normal(size=size) * 10).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.0], np.float32)
    x[:min(size, 7)] = special[:min(size, 7)]
    params = {"scale": -1.5} if name == "scale" else {}
    for offset in range(17):
        buf = np.full(size + offset + 40, 7, np.float32)
        start = (-buf.ctypes.data % 64) // 4 + offset
        out = buf[start:start + size]
        with paths.recording() as taken:
            kernel(out, [x], **params)
        plain = np.empty_like(x)
        with paths.plain(), paths.recording() as plain_taken:
            kernel(plain, [x], **params)
        assert taken[f"stream:{name}"] == 1 and not plain_taken
        assert np.array_equal(out.view(np.uint32), plain.view(np.uint32)), (name, offset)
        assert (buf[:start] == 7).all() and (buf[start + size:] == 7).all()


def test_small_float64_and_strided_maps_do_not_stream(monkeypatch):
    """Under STREAM_MIN_BYTES written, in float64 and from a strided x (gathered into out,
    mapped in place), the map is the plain template's."""
    kernel = get_op("sgn").kernels["cpu"]
    x = np.arange(-50, 50, dtype=np.float32).reshape(10, 10)
    for out, ins in ((np.empty_like(x), [x]), (np.empty((10, 10)), [x.astype(np.float64)])):
        with paths.recording() as taken:
            kernel(out, ins)
        assert not any(p.startswith("stream:") for p in taken)
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(block, "STREAM_MIN_RUN", 0)
    out = np.empty_like(x)
    with paths.recording() as taken:
        kernel(out, [x.T])
    assert not any(p.startswith("stream:") for p in taken)
    assert np.array_equal(out, np.sign(x.T))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("view", ["contiguous", "half_rows", "transposed"])
def test_cont_streams_rows_that_are_contiguous(dtype, view, monkeypatch):
    """cont of a contiguous x or of whole-row slices (concat's gradients) streams
    (copy:streaming) with the same bits; a transposed view takes the tiled copy."""
    monkeypatch.setattr(block, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(block, "STREAM_MIN_RUN", 0)
    base = np.random.default_rng(3).normal(size=(67, 130)).astype(dtype)
    x = {"contiguous": base, "half_rows": base[:, 65:], "transposed": base.T}[view]
    out = np.empty(x.shape, dtype)
    with paths.recording() as taken:
        cpu.unary("cont")(out, [x])
    assert np.array_equal(out.view(np.uint8), np.ascontiguousarray(x).view(np.uint8))
    assert ("copy:streaming" in taken) == (view != "transposed"), sorted(taken)
