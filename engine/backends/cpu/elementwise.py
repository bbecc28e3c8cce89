"""CPU kernels of the elementwise ops of engine.elementwise's table, keyed by op name.

Every op gets kernels of its own, made from the templates below: each template is a plain,
vectorisable `prange` loop that calls scalar math by a global name (`forward`, `gradient`,
`widen`), and `specialise` makes a copy of it whose globals bind those names to the op
row's scalar math, compiled with numba.njit (engine.backends.compile_scalar), which LLVM
inlines into the loop. numba compiles each copy once per dtype and caches it on disk under
a name of its own (the template's, the op's and a digest of the row's source).

`unary(name)`, `unary_back(name)` and `binary(name)` make the kernels of the table's op
`name` (engine.ops registers each in its op's definition). A kernel's dispatcher takes the
op's output buffer and its inputs (possibly strided or broadcast views), and never
allocates.

Rows with `in_float64` (the activations) compute in float64 whatever the dtype, rounded
once when stored; but their plain kernels widen with `float()`, which numba types as a
float32 for a float32 element, so on float32 tensors the row's libm calls are float32's
(sin as sinf: within an ulp) and its arithmetic float32 where no float64 constant enters
(the vector kernels below widen to float64 truly). The plain unary ops and the binary ops
compute in the inputs' dtype. An op's float parameters reach its scalar math as a tuple in
the row's order (of the dtype the math computes in).

The ops of engine.backends.cpu.vector_unary.FAST (the activations on exp, tanh, erfc,
log1p, sin and cos, and exp and log) have a second pair of kernels, compiled
`contracting`, for float32 outputs: the same values from vectorised float64 math instead
of a libm call per element (the fast path `vector:<op>`; its plain twin, the row's math,
runs in plain mode and for float64). The activations' vector kernels also read and write
16-bit arrays as their patterns (patterns.value and rounded: one pass, where the widened
float32 kernel takes three and two float32 temporaries, half.widened), computing in float32
where the op has float32 math for 16-bit results (vector_unary's forward16: sigmoid, silu,
gelu_quick, gelu_erf, softplus, tanh, elu; copies of their own, the float32 kernels apart,
which load and store with the bare conversion instructions, _BARE16), and the float32
kernels too where the op has float32 math for float32 results (forward32: sigmoid and tanh,
and gradient32: theirs and softplus's; a copy of its own, reading the float32 elements as
they are); exp's and log's 16-bit nodes stay widened, as every other kernel's (the
self-test's rounding mutants of half.store act through exp's).
"""

from __future__ import annotations

import functools
import types

import numba
import numpy as np

from engine import elementwise as table
from engine.backends.calls import sequence
from engine.backends.compile_scalar import compile_scalar, source_digest
from engine.backends.cpu import block, half, layout, paths, threads
from engine.backends.cpu.block import store_fence, stream_run
from engine.backends.cpu.jit import (
    CONTRACT,
    OPTIONS,
    bindable,
    call,
    parallel_kernel,
    prange,
    scalar_math,
)
from engine.backends.cpu.patterns import (
    as_patterns,
    fmt_of,
    native_half,
    rounded,
    rounded_number,
    value,
    value_number,
)
from engine.backends.cpu.vector_unary import FAST
from engine.tensor import is_half

# the scalar math is compiled into each kernel that calls it (LLVM inlines it there) and
# cached with it; the functions themselves get no cache entries of their own
_scalar_jit = numba.njit(**{**OPTIONS, "cache": False})
_COMPILED: dict = {}


def scalar(fn):
    """Scalar function `fn` of the table compiled for the CPU (numba.njit)."""
    return compile_scalar(fn, _scalar_jit, _COMPILED)


# --- templates: the names forward, gradient and widen are bound per op (specialise) -------
def _map(x, out, params):
    """out[i] = forward(widen(x[i]), *params) over 1-D contiguous arrays (out may alias x);
    widen is float for rows computing in float64, else the identity."""
    for i in prange(x.size):
        out[i] = forward(widen(x[i]), *params)  # noqa: F821


def _gradient_map(g, x, out, params):
    """out[i] = gradient(g[i], float(x[i]), *params) = g f'(x) over 1-D contiguous arrays
    (out may alias x)."""
    for i in prange(x.size):
        out[i] = gradient(g[i], float(x[i]), *params)  # noqa: F821


FMT = half.F16      # the vector templates' 16-bit format: each copy binds its own


# The vector loops start at the loaded array's first 64-byte boundary, the elements before it
# (at most 15 float32, 31 16-bit) taken by a loop of their own (_to_line): a vector load that
# straddles two cache lines costs two, and numpy's big arrays start 16 bytes past a page (an
# mmap'd chunk's header), so that every load of a 512-bit kernel straddled. tanh's float32
# forward kernel (512 bits wide: vector_math.wide_vectors) over 8M elements took 2.65-3.07
# ns an element from x 16 bytes past a line, 1.58-1.81 from a line (out at either; serial
# kernel, one thread, CPU time, load 5); torch's allocator aligns its tensors to 64 bytes.
# Which element a lane computes changes nothing: the head's loop is the same math, and the
# bits are those of every other split of the array (tests/engine/backends/cpu/
# test_elementwise.py compares them).
@scalar_math
def _to_line(a):
    """The elements of 1-D contiguous array `a` before its first 64-byte boundary (all of
    them where it has none)."""
    address = np.int64(a.ctypes.data)
    return min(a.size, ((np.int64(64) - address % np.int64(64)) % np.int64(64)) // a.itemsize)


def _vector_map(x, out, params):
    """out[i] = forward(x[i]'s value in the math's type, params), rounded to out's element,
    over 1-D contiguous arrays (out may alias x): float32, or 16-bit patterns of format FMT
    (patterns.value and rounded; FMT a constant of each copy of the template: as an
    argument, the loops of the reach templates below tested it per element, 4 times
    slower); forward a vector_unary function, params a tuple; `arith` float64, or float32
    for a 16-bit copy whose math computes in float32 (vector_unary's forward16). The loop
    starts at x's first 64-byte boundary (_to_line)."""
    head = _to_line(x)
    for i in range(head):
        out[i] = rounded(forward(arith(value(x[i], FMT)), params), out, FMT)  # noqa: F821
    xs, os = x[head:], out[head:]
    for i in prange(xs.size):
        os[i] = rounded(forward(arith(value(xs[i], FMT)), params), os, FMT)  # noqa: F821


def _vector_gradient_map(g, x, out, params):
    """out[i] = gradient(g[i], x[i], params) as _vector_map, g of x's type."""
    head = _to_line(x)
    for i in range(head):
        out[i] = rounded(gradient(arith(value(g[i], FMT)),  # noqa: F821
                                  arith(value(x[i], FMT)), params), out, FMT)  # noqa: F821
    gs, xs, os = g[head:], x[head:], out[head:]
    for i in prange(xs.size):
        os[i] = rounded(gradient(arith(value(gs[i], FMT)),  # noqa: F821
                                 arith(value(xs[i], FMT)), params), os, FMT)  # noqa: F821


# Streaming twins of the maps (the fast path stream:<op>), for a float32 output the engine's
# threads write 16 MiB or more of together (block.streams): blocks of _STREAM_BLOCK elements
# computed into a scratch that stays in the first-level cache, then copied out by streaming
# stores (block.stream_run), which write a cache line without reading it first: an ordinary
# store reads each line of a buffer too big for the caches in, then writes it back, so a map
# over 8M float32 moves 96 MB where the streamed one moves 64. Each block starts on a
# 64-byte boundary of out (its elements before that by an ordinary loop, as _to_line's), so
# the vectors stream from aligned addresses; the element math and so the bits are the
# plain template's (tests/engine/backends/cpu/test_elementwise.py compares them). sgn's
# forward and backward (scale(g, 0)) over 8M float32, one thread's CPU time per call
# (python bench/profile_op.py --op sgn --calls 9, load 5): 6.09 and 4.95 ms with ordinary
# stores, 4.47 and 3.92 streamed. The activations' vector kernels keep ordinary stores:
# their math, not memory, bounds them (sigmoid's float32 forward 13.5 ms of CPU per 8M,
# where a streamed copy of 32 MB takes 2.5), and a streamed twin of _vector_map, its
# inner loop over the scratch, ran 1.3-2.2 times slower (LLVM vectorised it less well).
_STREAM_BLOCK = 4096      # 16 KB of float32: the scratch, with its block of x, fits L1


def _map_streaming(x, out, params):
    """_map for a big contiguous out, streamed (see above); serial (the engine's threads
    split it)."""
    head = _to_line(out)
    for i in range(head):
        out[i] = forward(widen(x[i]), *params)  # noqa: F821
    buf = np.empty(_STREAM_BLOCK, out.dtype)
    for lo in range(head, x.size, _STREAM_BLOCK):
        m = min(_STREAM_BLOCK, x.size - lo)
        xs = x[lo:lo + m]
        for i in range(m):
            buf[i] = forward(widen(xs[i]), *params)  # noqa: F821
        stream_run(out[lo:lo + m], buf[:m])
    store_fence()


# The 16-bit copies of the float32 math (vector_unary's forward16 and gradient16) load and
# store with the conversion instructions alone (patterns.value_number, rounded_number),
# without the per-element NaN fix-ups of value and rounded, which keep a NaN's pattern
# through a load and a store: float16 sigmoid's forward took 8.8 and 9.2 ms of CPU time per
# 8M elements with them, 5.7 and 5.1 without, its backward 7.5 and 7.3, then 5.1 and 5.0
# (python bench/profile_op.py --op sigmoid --case f16 --calls 9, twice each, one thread).
# The bits are the same: a fix-up keeps a signalling NaN's quiet bit clear (bfloat16's
# store also drops the rounding of a NaN's lower half), and every result of that math is
# made by an arithmetic instruction, whose NaNs are quiet and carry an input's payload (or
# none), never a loaded value passed through (where two NaNs meet, which one a product
# returns is LLVM's choice, and the two kernels' scalar loops chose differently for
# gelu_erf's gradient); tests/engine/backends/cpu/test_elementwise.py compares the two
# kernels' bits over every 16-bit pattern, signalling NaNs included.
def _vector_map16(x, out, params):
    """_vector_map for 16-bit patterns and float32 math, with the bare conversions."""
    head = _to_line(x)
    for i in range(head):
        out[i] = rounded_number(forward(value_number(x[i], FMT), params),  # noqa: F821
                                out, FMT)
    xs, os = x[head:], out[head:]
    for i in prange(xs.size):
        os[i] = rounded_number(forward(value_number(xs[i], FMT), params),  # noqa: F821
                               os, FMT)


def _vector_gradient_map16(g, x, out, params):
    """_vector_gradient_map for 16-bit patterns and float32 math, as _vector_map16."""
    head = _to_line(x)
    for i in range(head):
        out[i] = rounded_number(gradient(value_number(g[i], FMT),  # noqa: F821
                                         value_number(x[i], FMT), params), out, FMT)
    gs, xs, os = g[head:], x[head:], out[head:]
    for i in prange(xs.size):
        os[i] = rounded_number(gradient(value_number(gs[i], FMT),  # noqa: F821
                                        value_number(xs[i], FMT), params), os, FMT)


_BARE16 = {_vector_map: _vector_map16, _vector_gradient_map: _vector_gradient_map16}
_BLOCK = 1024        # elements of a block of the reach templates


def _vector_map_reach(x, out, params):
    """_vector_map, and for the elements with |x| > reach (rare: sin and cos beyond 2^20),
    the row's math in float64 (`wide`, a libm call), in a third loop over each block of
    _BLOCK elements where a second counts one, so that the first loop has no call and
    vectorises as _vector_map's. Each loop runs over slices: over index ranges of the
    whole arrays, the same loops took twice the time (a sin kernel's, 20 ms for 8M)."""
    n = x.size
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        xs = x[b * _BLOCK:min(n, (b + 1) * _BLOCK)]
        os = out[b * _BLOCK:min(n, (b + 1) * _BLOCK)]
        for i in range(xs.size):
            os[i] = rounded(forward(float64(value(xs[i], FMT)), params), os, FMT)  # noqa: F821
        beyond = 0
        for i in range(xs.size):
            beyond += abs(float64(value(xs[i], FMT))) > reach  # noqa: F821
        if beyond:
            for i in range(xs.size):
                v = float64(value(xs[i], FMT))
                if abs(v) > reach:  # noqa: F821
                    os[i] = rounded(wide(v, *params), os, FMT)  # noqa: F821


def _vector_gradient_map_reach(g, x, out, params):
    """_vector_gradient_map with the row's gradient beyond reach (as _vector_map_reach)."""
    n = x.size
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        gs = g[b * _BLOCK:min(n, (b + 1) * _BLOCK)]
        xs = x[b * _BLOCK:min(n, (b + 1) * _BLOCK)]
        os = out[b * _BLOCK:min(n, (b + 1) * _BLOCK)]
        for i in range(xs.size):
            os[i] = rounded(gradient(value(gs[i], FMT), float64(value(xs[i], FMT)),  # noqa: F821
                                     params), os, FMT)
        beyond = 0
        for i in range(xs.size):
            beyond += abs(float64(value(xs[i], FMT))) > reach  # noqa: F821
        if beyond:
            for i in range(xs.size):
                v = float64(value(xs[i], FMT))
                if abs(v) > reach:  # noqa: F821
                    os[i] = rounded(wide(float64(value(gs[i], FMT)), v, *params),  # noqa: F821
                                    os, FMT)


@scalar_math
def float64(v):
    """v in float64: the vector kernels' widening (numba types float() of a float32 as a
    float32)."""
    return np.float64(v)


@scalar_math
def float32(v):
    """v in float32: the 16-bit vector kernels' type where their math is float32's."""
    return np.float32(v)


# The rows of HALF_NATIVE, relu and relu_back, give their inputs' patterns or +0: their
# 16-bit kernels compute on the patterns, in integer lanes (16 to a 256-bit vector). Until
# issue 37's tenth round they widened each element to float32 and rounded the result back
# in the loop (patterns.value, rounded), and relu's forward + backward over 8M float16
# elements took 1.9-2.2 times torch's on the AVX2 machine (bench_ops).
@scalar_math
def _positive_bits(x, fmt):
    """Whether 16-bit pattern x of format fmt is a value above 0: not a zero, its sign
    clear, at most infinity's pattern (a NaN is none)."""
    return (x != 0) & (x <= (0x7C00 if fmt == half.F16 else 0x7F80))


@scalar_math
def _relu_bits(x, fmt):
    """relu on a 16-bit pattern: x where its value is above 0, else +0."""
    return x if _positive_bits(x, fmt) else np.uint16(0)


@scalar_math
def _relu_back_bits(g, x, fmt):
    """relu_back on 16-bit patterns: g where x's value is above 0, else +0, as the widened
    kernel gives them (which quiets a signalling bfloat16 NaN g and keeps a float16 one's
    pattern)."""
    quiet = np.uint16(g | 0x0040) if fmt == half.BF16 and (g & 0x7FFF) > 0x7F80 else g
    return quiet if _positive_bits(x, fmt) else np.uint16(0)


# the rows of HALF_NATIVE (its keys) computed on the patterns: op name -> function of the
# patterns and the format
HALF_BITS = {"relu": _relu_bits, "relu_back": _relu_back_bits}


def _half_bits_map(x, out, params):
    """out[i] = bits(x[i], FMT) over 1-D contiguous arrays of 16-bit patterns of format
    FMT (out may alias x): the row's result computed on the patterns (HALF_BITS)."""
    for i in prange(x.size):
        out[i] = bits(x[i], FMT)  # noqa: F821


def _half_bits_binary_flat(a, b, out):
    """out[i] = bits(a[i], b[i], FMT) over 1-D contiguous arrays of one size of 16-bit
    patterns of format FMT (HALF_BITS)."""
    for i in prange(out.size):
        out[i] = bits(a[i], b[i], FMT)  # noqa: F821


# Plain rows whose 16-bit kernels read and write the patterns in one pass (the path
# `half:<op>`; the plain twin, the float32 kernel widened, in plain mode): relu over 8M
# float16 elements took 7.0 times torch's forward and backward, in bfloat16 3.9, widened
# (half.widened: a float32 copy of x, the kernel, the rounding pass; python
# bench/bench_ops.py --op relu --repeat 7 --threads 1, load 7). Their values are the
# widened kernel's, bit for bit (tests/engine/backends/cpu/test_elementwise.py).
HALF_NATIVE = tuple(HALF_BITS)


def _half_kernels(template, name: str, row_fn, bits):
    """{F16: kernel, BF16: kernel}: `template` bound to the op's function of the patterns
    `bits` (HALF_BITS; the row's function `row_fn` keys the cache name with it) and a
    16-bit format."""
    return {fmt: specialise(template, f"{name}_{label}", row_fn, bits.py_func, bits=bits,
                            FMT=fmt)
            for fmt, label in ((half.F16, "f16"), (half.BF16, "bf16"))}


def _binary_flat(a, b, out):
    """out[i] = forward(a[i], b[i]) over 1-D contiguous arrays of one size."""
    for i in prange(out.size):
        out[i] = forward(a[i], b[i])  # noqa: F821


def _binary_rows(a, a_rows, a_step, b, b_rows, b_step, out, run):
    """Row r of a broadcast binary op (see engine.backends.cpu.layout):
    out[r run + j] = forward(a[a_rows[r] + a_step j], b[b_rows[r] + b_step j]), steps 0
    or 1. Each case is a loop over contiguous slices, which LLVM vectorises."""
    for r in prange(a_rows.size):
        o = out[r * run:(r + 1) * run]
        ao = a_rows[r]
        bo = b_rows[r]
        if a_step == 1 and b_step == 1:
            x = a[ao:ao + run]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = forward(x[j], y[j])  # noqa: F821
        elif a_step == 1:
            x = a[ao:ao + run]
            w = b[bo]
            for j in range(run):
                o[j] = forward(x[j], w)  # noqa: F821
        elif b_step == 1:
            v = a[ao]
            y = b[bo:bo + run]
            for j in range(run):
                o[j] = forward(v, y[j])  # noqa: F821
        else:
            value = forward(a[ao], b[bo])  # noqa: F821
            for j in range(run):
                o[j] = value


@scalar_math
def row_index(r, d1, d2):
    """(i0, i1, i2): where row r of the d0*d1*d2 rows of a (d0, d1, d2, d3) array lies
    (the 4-D templates' outer loop, here and in engine.backends.cpu.glu)."""
    return r // (d1 * d2), (r // d2) % d1, r % d2


def _binary_4d(a, b, out):
    """out = forward(a, b) over 4-D arrays of out's shape (any strides; the general
    fallback)."""
    d0, d1, d2, d3 = out.shape
    for r in prange(d0 * d1 * d2):
        i0, i1, i2 = row_index(r, d1, d2)
        for i3 in range(d3):
            out[i0, i1, i2, i3] = forward(a[i0, i1, i2, i3], b[i0, i1, i2, i3])  # noqa: F821


def specialise(template, op_name: str, *sources, options=None, **bound):
    """`template` compiled for op `op_name` (serial and parallel, jit.parallel_kernel, with
    numba `options` beside jit's), its global names `bound` to compiled scalar math.
    numba's disk cache keys a function by its qualified name: each op's copy gets its own,
    which also carries the digest of the row's `sources`, so that editing a row's math (in
    another file than this one, which is all numba watches) recompiles it."""
    fn = types.FunctionType(template.__code__, {**template.__globals__, **bound},
                            f"{template.__name__}__{op_name}")
    fn.__qualname__ = f"{template.__qualname__}__{op_name}_{source_digest(*sources)}"
    fn.__doc__ = template.__doc__
    return parallel_kernel(fn, **(options or {}))


def _vector_twin(template, op_name: str, fn, **bound):
    """`template` for op `op_name`'s float32 fast path, its global names `bound` to
    vector_unary's `fn` (whose source keys the cache name), compiled contracting."""
    return specialise(template, op_name, fn.py_func, options=CONTRACT, **bound)


def _lazy(make, *args, **kwargs):
    """A zero-argument function returning the serial compilation of make(*args, **kwargs)
    (a specialised template), made at its first call: the streaming twins run only on big
    outputs, and importing the engine need not make them; serial, as the engine's threads
    split them (their loops are no pranges)."""
    made = []

    def get():
        if not made:
            made.append(make(*args, **kwargs).serial)
        return made[0]
    return get


def _vector_kernels(template, reach_template, name: str, fn, reach: float, wide, fn16,
                    slot: str, fn32=None, bare: bool = True):
    """The vector kernels of op `name`, {F32: kernel, F16: ..., BF16: ...} by output (F32
    for float32, else the 16-bit format), or None without `fn`: `template` with `fn`
    bound to the global `slot` (forward or gradient), or where the math reaches only so
    far (sin, cos), `reach_template` with the row's math `wide` beyond. The 16-bit copies
    take `fn16` (float32 arithmetic) where given, with the bare conversions (_BARE16;
    `bare` False: value's and rounded's, the twin test_elementwise.py compares them with);
    otherwise the F16 copies of `fn` serve float32 too. The float32 kernels take `fn32`
    (float32 arithmetic for float32 results) where given."""
    if fn is None:
        return None
    bound = {}
    if reach != np.inf:
        template, bound = reach_template, {"reach": reach, "wide": wide}

    def one(label, fmt, math_fn, arith, template=template, **more):
        b = {**bound, slot: math_fn, "FMT": fmt, "arith": arith, **more}
        return _vector_twin(template, f"{name}_{label}", math_fn, **b)
    single = fn32 and {F32: one("f32_in_f32", half.F16, fn32, float32, value=float32_element)}
    one16 = one
    if bare and template in _BARE16:                  # the bare conversions (_BARE16)
        one16 = functools.partial(one, template=_BARE16[template])
    return {**by_output(one, fn, fn16, one16), **(single or {})}


def by_output(one, fn, fn16, one16=None):
    """{F32: kernel, F16: ..., BF16: ...} of a vector template, made by one(label, fmt,
    math, arith): the float64 math `fn` for float32 outputs, and for 16-bit ones `fn16` in
    float32 arithmetic where given (copies of their own, by their cache names, made by
    `one16` where given), else the F16 copy of `fn`, which then serves float32 too."""
    if fn16 is None:
        kernels = {fmt: one(label, fmt, fn, float64)
                   for fmt, label in ((half.F16, "f16"), (half.BF16, "bf16"))}
        return {F32: kernels[half.F16], **kernels}
    one16 = one16 or one
    return {F32: one("f32", half.F16, fn, float64),
            half.F16: one16("f16_in_f32", half.F16, fn16, float32),
            half.BF16: one16("bf16_in_f32", half.BF16, fn16, float32)}


@scalar_math
def float32_element(v, fmt):
    """A float32 element as it is, for the float32 kernels of float32 math (in place of
    patterns.value, whose float64 widening, rounded back, LLVM kept where a comparison
    used it: the loop then ran 8 lanes wide, float64's count, where float32 fills 16)."""
    return v


F32 = -1        # _vector_kernels' key of the float32 kernels (half's formats are 0 and 1)


def dispatcher(op_name: str, plain_call, vector_call, native: bool,
               chunks=threads.elementwise_chunks, half_call=None):
    """The kernel of op `op_name` from its preparations: `vector_call(out, ins, params,
    fmt)` (None: no vector kernel) for a float32 output and, where `native`, a 16-bit one
    (its patterns, in one pass: the kernel is marked patterns.native_half), outside plain
    mode (the path `vector:<op>`); `plain_call(out, ins, params)` otherwise, a 16-bit
    output through float32 temporaries (half.widened) as for every kernel that is not
    native. `chunks`: how the kernel is split over the engine's threads (threads.split; the
    GLU kernels, engine.backends.cpu.glu, cut along axis 0 with their inputs).
    `half_call(out, ins, params, fmt)`, or None: a 16-bit output's kernel on its patterns
    outside plain mode (the path `half:<op>`, HALF_NATIVE)."""
    plain = bindable(lambda out, ins, **params: plain_call(out, ins, params))
    widened = half.widened(plain)

    def prepare(out, ins, **params):
        half_out = is_half(out.dtype)
        if vector_call is not None and not paths.PLAIN and (
                out.dtype == np.float32 or half_out and native):
            paths.taken(f"vector:{op_name}")
            return vector_call(out, ins, params, fmt_of(out))
        if half_call is not None and half_out and not paths.PLAIN:
            run = half_call(out, ins, params, fmt_of(out))
            if run is not None:
                paths.taken(f"half:{op_name}")
                return run
        return (widened if half_out else plain).bind(out, ins, **params)
    prepare.__name__ = f"cpu_{op_name}"
    kernel = threads.split(bindable(prepare), chunks=chunks)
    own_half = native and vector_call is not None or half_call is not None
    return native_half(kernel) if own_half else kernel


# A strided x is copied into a C-contiguous buffer of its own (layout.dense: allocated when
# the call is bound, filled when it runs) and mapped from there. Gathered into out and
# mapped in place instead, the vector kernels needed in-place twins: given two names for
# one array, LLVM's run-time overlap check sends the loop to its scalar version (gelu_erf
# over a strided (2048, 4096) half of a (2048, 8192) array took 153 ms where the
# contiguous half took 39, one thread, load 7), and those twins, compiled for the strided
# cases of every activation and dtype, were 56 of the 728 compilations of a cold
# `gradcheck --all`, 28 s of its 165 s of compiling at a load of 6 (`python
# bench/bench_first_run.py --breakdown --records F`). The buffer costs x's size, for
# strided inputs only; the bits are the contiguous input's (test_elementwise.py).
def _mapped(kernel, ins, out, args, streaming=None):
    """A call of map `kernel` on ins (the last of which is x, possibly strided) into out:
    a strided x first copied C-contiguous (layout.dense: a transposed view in tiles, any
    other by numpy, whose copy picks the best loop order for any strides); 16-bit arrays
    as their patterns. `streaming`: (op name, a function giving the kernel's streaming
    twin) or None: a contiguous float32 x whose out streams (block.streams) takes the twin
    (the fast path stream:<op>)."""
    *rest, x = ins
    flat_out = as_patterns(out).reshape(-1)
    rest = [as_patterns(a).reshape(-1) for a in rest]
    if (x.flags.c_contiguous and streaming is not None and streaming[1] is not None
            and out.dtype == np.float32 and block.streams(out)):
        paths.taken(f"stream:{streaming[0]}")
        kernel = streaming[1]()
    copies: list = []
    x = layout.dense(x, copies)
    return sequence(*copies, call(kernel, *rest, as_patterns(x).reshape(-1), flat_out, args))


def unary(name: str):
    """The kernel of unary op `name` of the table: kernel(out, [x], **params); for `cont`
    (engine.ops.shape's), the copy alone."""
    if name == "cont":
        return cont
    row = table.UNARY[name]
    widen = float if row.in_float64 else scalar(table.identity)
    plain = specialise(_map, name, row.forward, forward=scalar(row.forward), widen=widen)
    plain_streaming = _lazy(specialise, _map_streaming, name, row.forward,
                            forward=scalar(row.forward), widen=widen)
    fast = FAST.get(name)
    vector = fast and _vector_kernels(_vector_map, _vector_map_reach, name, fast.forward,
                                      fast.reach, scalar(row.forward), fast.forward16,
                                      "forward", fast.forward32)

    def plain_call(out, ins, params):
        cast = float if row.in_float64 else out.dtype.type
        return _mapped(plain, ins, out, row.kernel_args(name, params, cast),
                       streaming=(name, plain_streaming))

    def vector_call(out, ins, params, fmt):
        fmt = fmt if is_half(out.dtype) else F32
        return _mapped(vector[fmt], ins, out, row.kernel_args(name, params))

    halves = (_half_kernels(_half_bits_map, name, row.forward, HALF_BITS[name])
              if name in HALF_NATIVE else None)

    def half_call(out, ins, params, fmt):
        return _mapped(halves[fmt], ins, out, row.kernel_args(name, params, np.float32))
    return dispatcher(name, plain_call, vector and vector_call, native=row.in_float64,
                      half_call=half_call if halves else None)


def unary_back(name: str):
    """The kernel of `<name>_back`: kernel(out, [g, x], **params) = g f'(x) in one pass,
    for unary op `name` of the table. g must be C-contiguous (the op's builder makes it
    so); a strided x is copied C-contiguous first (_mapped)."""
    row = table.UNARY[name]
    plain = specialise(_gradient_map, name, row.gradient, gradient=scalar(row.gradient))
    fast = FAST.get(name)
    vector = fast and _vector_kernels(_vector_gradient_map, _vector_gradient_map_reach, name,
                                      fast.gradient, fast.reach, scalar(row.gradient),
                                      fast.gradient16, "gradient", fast.gradient32)

    def plain_call(out, ins, params):
        return _mapped(plain, ins, out, row.kernel_args(row.back_name, params))

    def vector_call(out, ins, params, fmt):
        fmt = fmt if is_half(out.dtype) else F32
        return _mapped(vector[fmt], ins, out, row.kernel_args(row.back_name, params))
    return dispatcher(row.back_name, plain_call, vector and vector_call,
                       native=row.in_float64)


def binary(name: str):
    """The kernel of binary op `name` of the table: kernel(out, [a, b]) with numpy
    broadcasting. Same-shape contiguous operands run flat; broadcast ones as rows
    (layout.Rows: a bias over the rows of a matrix, a channel bias over images); a
    transposed operand is copied first (_dense_rows); other layouts as 4-D views."""
    row = table.BINARY[name]
    forward = scalar(row.forward)
    flat, by_rows, general = (specialise(t, name, row.forward, forward=forward)
                              for t in (_binary_flat, _binary_rows, _binary_4d))
    if name in HALF_NATIVE:
        return _binary_half(name, row, forward, flat)

    def prepare(out, ins):
        a, b = ins
        if _flat(out, a, b):
            return call(flat, a.reshape(-1), b.reshape(-1), out.reshape(-1))
        rows = layout.Rows.of(out.shape, [a, b]) if out.flags.c_contiguous else None
        copies: list = []
        if rows is None and out.flags.c_contiguous:     # a transposed operand (_dense_rows)
            a, b = layout.dense(a, copies), layout.dense(b, copies)
            if _flat(out, a, b):
                return sequence(*copies, call(flat, a.reshape(-1), b.reshape(-1),
                                              out.reshape(-1)))
            rows = layout.Rows.of(out.shape, [a, b])
        if rows is not None:
            (ab, bb), (ar, br), (sa, sb) = rows.bases, rows.offsets, rows.steps
            return sequence(*copies, call(by_rows, ab, ar, sa, bb, br, sb, out.reshape(-1),
                                          rows.run))
        return _binary_views(general, np.broadcast_to(a, out.shape),
                             np.broadcast_to(b, out.shape), out)
    prepare.__name__ = f"cpu_{name}"
    return threads.split(bindable(prepare))


# _dense_rows: an operand whose last axis is neither contiguous nor broadcast (a transposed
# or permuted view) is copied C-contiguous first (layout.dense), and the operands then run
# flat or as rows: as 4-D strided views (the general kernel, now for an output that is not
# C-contiguous and for operands of different item sizes) numba compiled the op's kernel
# once more for every combination of the two operands' layouts, 46 compilations in a cold
# `gradcheck --all` (`python bench/bench_first_run.py --breakdown`, load 5-6).


def _flat(out, a, b) -> bool:
    """Whether binary operands a and b and out are contiguous arrays of one shape."""
    return (a.shape == b.shape == out.shape and a.flags.c_contiguous
            and b.flags.c_contiguous)


def _binary_half(name, row, forward, flat):
    """The kernel of binary op `name` of HALF_NATIVE (relu_back: operands of one shape):
    flat over contiguous operands, 16-bit ones as patterns (the path half:<op>); other
    layouts as 4-D views, 16-bit ones widened."""
    general = specialise(_binary_4d, name, row.forward, forward=forward)
    halves = _half_kernels(_half_bits_binary_flat, name, row.forward, HALF_BITS[name])

    def plain_call(out, ins, params):
        copies: list = []
        a, b = ins
        if out.flags.c_contiguous and a.shape == b.shape == out.shape:     # _dense_rows
            a, b = layout.dense(a, copies), layout.dense(b, copies)
        if _flat(out, a, b):
            return sequence(*copies, call(flat, a.reshape(-1), b.reshape(-1),
                                          out.reshape(-1)))
        return _binary_views(general, np.broadcast_to(a, out.shape),
                             np.broadcast_to(b, out.shape), out)

    def half_call(out, ins, params, fmt):
        a, b = ins
        if not _flat(out, a, b):
            return None
        return call(halves[fmt], *(as_patterns(t).reshape(-1) for t in (a, b, out)))
    return dispatcher(name, plain_call, None, native=False, half_call=half_call)


def _binary_views(kernel, a, b, out):
    """The general case: coalesced axes as 4-D views, a loop in Python over any more."""
    dims = layout.coalesce(out.shape, a.strides, b.strides, out.strides) or [(1, [0, 0, 0])]
    pad = [(1, [0, 0, 0])] * max(4 - len(dims), 0)
    dims = pad + dims
    shape = [n for n, _ in dims]
    views = [layout.as_strided(arr, shape, [st[k] for _, st in dims])
             for k, arr in enumerate((a, b, out))]
    lead = len(dims) - 4
    return sequence(*(call(kernel, *(v[idx] for v in views))
                      for idx in np.ndindex(*shape[:lead])))   # several for > 4 axes only


_copy = specialise(_map, "copy", table.identity, forward=scalar(table.identity),
                    widen=scalar(table.identity))


def _cont_prepare(out, ins):
    """cont: a contiguous x copied by the copy map, a strided one gathered into out; a big
    x whose rows are contiguous (concat's gradients: halves of the upstream gradient's
    rows) by block.copy_block's streaming stores (copy:streaming) where its rows are
    block.STREAM_MIN_RUN bytes or longer (shorter ones, a permuted view's, take the tiled
    and numpy copies of layout.copy_call)."""
    (x,) = ins
    if (x.ndim and x.strides[-1] == x.itemsize
            and x.shape[-1] * x.itemsize >= block.STREAM_MIN_RUN and block.streams(out)):
        return block.copy_block_call(as_patterns(out), as_patterns(x))
    if x.flags.c_contiguous:
        return call(_copy, x.reshape(-1), out.reshape(-1), ())
    return layout.copy_call(out, x)


_cont_prepare.__name__ = "cpu_cont"
cont = threads.split(bindable(_cont_prepare))
