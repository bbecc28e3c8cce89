"""Registry ops translated to ggml calls: one table row per op.

A row gives the ggml call (`ggml`, shown in the docs and reports), `build(g, case, xs)` making
the case's output from its input tensors xs (param leaves, permuted views of them, I32 index
tensors), and `why_not(case)`: why ggml cannot express that case, or None.

Conventions (see graph.py for shapes, permutes and strides):
- ggml's API asserts some preconditions when an op is built (rows contiguous for
  ggml_unary ops, a contiguous input for ggml_soft_max_ext and ggml_reshape, a padded-1d
  input for ggml_scale, a non-transposed first operand for ggml_mul_mat). A strided view
  is passed through ggml_cont exactly where such a precondition requires it (the
  Context's contiguous, rows_contiguous, padded_1d, not_transposed), as a ggml user
  must; everywhere else the op receives the strided view itself, so its kernel's strided
  path is what is checked. The engine's own softmax, cross_entropy_loss and rms_norm put
  cont in front of strided inputs, and so does their translation.
- ggml broadcasts only the second operand of add/sub/mul/div into the first
  (ggml_can_repeat(b, a)); add and mul, being commutative, swap their operands when only
  the first one broadcasts. mul_mat broadcasts the batch of its first operand only.
- Index inputs (get_rows) are I32 tensors holding the case's index values contiguously;
  they are never checked (integers), so need no declining.
- What ggml's backward does not cover (ops without a backward, inputs without a
  gradient) is listed apart, in coverage.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from checkkit.ggml import GGML_OP_POOL_AVG, GGML_OP_POOL_MAX, GGML_TYPE_F32
from engine.ops.reduce import normalize_axes
from engine.params import pair
from engine.tensor import as_dtype
from gradcheck.adapters.ggml.graph import byte_offset, contiguous_nb, ggml_type, ne_of
from gradcheck.adapters.ggml.rope import rope_ext


@dataclasses.dataclass(frozen=True)
class GgmlOp:
    """One registry op in ggml: the call it becomes, its builder and its limits."""

    ggml: str
    build: Callable
    why_not: Callable = lambda case: None


def _shapes(case):
    return [spec.shape for spec in case.inputs]


# --- elementwise ----------------------------------------------------------------------------
def _unary(name, rows_contiguous):
    def build(g, case, xs):
        x = g.rows_contiguous(xs[0]) if rows_contiguous else xs[0]
        return getattr(g, name)(x)
    return GgmlOp(f"ggml_{name}" + (" (cont if rows strided)" if rows_contiguous else ""),
                  build)


def _fits(shape, out) -> bool:
    return (1,) * (len(out) - len(shape)) + tuple(shape) == tuple(out)


def _binary(name, commutative):
    def why_not(case):
        sa, sb = _shapes(case)
        out = np.broadcast_shapes(sa, sb)
        if _fits(sa, out) or (commutative and _fits(sb, out)):
            return None
        return (f"ggml_{name} broadcasts only its second operand into the first "
                f"(ggml_can_repeat(b, a)); here a {list(sa)} would have to broadcast to "
                f"{list(out)}")

    def build(g, case, xs):
        sa, sb = _shapes(case)
        a, b = xs
        if not _fits(sa, np.broadcast_shapes(sa, sb)):
            a, b = b, a
        return getattr(g, name)(a, b)
    return GgmlOp(f"ggml_{name}(a, b)" + (" (or (b, a))" if commutative else ""),
                  build, why_not)


# --- reductions -----------------------------------------------------------------------------
def _axes(case):
    x = case.inputs[0].shape
    axis = case.kwargs.get("axis")
    return x, (tuple(range(len(x))) if axis is None else normalize_axes(case.op, x, axis))


def _reduce_why_not(case):
    x, axes = _axes(case)
    if axes in (tuple(range(len(x))), (len(x) - 1,)):
        return None
    return (f"ggml reduces all elements or along rows (the last axis) only; axes "
            f"{list(axes)} of {list(x)} need a composition")


def _sum(g, case, xs):
    x, axes = _axes(case)
    if axes == (len(x) - 1,) and case.kwargs.get("axis") is not None:
        return g.sum_rows(xs[0])
    return g.sum(xs[0])


def _mean(g, case, xs):
    x, axes = _axes(case)
    if axes == (len(x) - 1,):
        return g.mean(xs[0])
    return g.mean(g.reshape_1d(g.contiguous(xs[0]), int(np.prod(x))))


# --- indexing, tiling, products -------------------------------------------------------------
def _get_rows(g, case, xs):
    table, idx = xs
    if len(case.inputs[1].shape) == 1:
        return g.get_rows(table, idx)
    # (B, K) indices: ggml_get_rows wants a table per index row (a->ne[2] == b->ne[1]), so
    # the indices are flattened to B*K, and the (B*K, C) rows reshaped to (B, K, C)
    b, k = case.inputs[1].shape
    rows = g.get_rows(table, g.reshape_1d(idx, b * k))
    return g.reshape_4d(rows, case.inputs[0].shape[1], k, b, 1)


def _matmul_order(case):
    """1: ggml_mul_mat(b^T, a) (b's batch broadcasts); 2: its transpose ggml_mul_mat(a, b^T)^T
    (a's batch broadcasts); None: neither operand's batch is the output's. ggml takes a
    16-bit operand as its first (the weights, src0) only, its second being F32: with a
    16-bit `a` and a float32 `b`, order 2 or none."""
    sa, sb = _shapes(case)
    out = np.broadcast_shapes(sa[:-2], sb[:-2])
    if len(out) > 2:
        return None
    da, db = (spec.dtype or case.dtype for spec in case.inputs)
    if da != db and da in ("f16", "bf16"):
        return 2 if _fits(sb[:-2], out) else None
    return 1 if _fits(sa[:-2], out) else 2 if _fits(sb[:-2], out) else None


def _matmul_why_not(case):
    if _matmul_order(case) is None:
        da, db = (spec.dtype or case.dtype for spec in case.inputs)
        if da != db and da in ("f16", "bf16"):
            return ("ggml_mul_mat takes a 16-bit operand first only (its weights, src0; "
                    "the second must be F32, ggml-cpu.c:1331), and a's batch is not the "
                    "output's")
        sa, sb = _shapes(case)
        return (f"ggml_mul_mat broadcasts the batch of its first operand only; neither "
                f"{list(sa[:-2])} nor {list(sb[:-2])} is the output's batch")
    return None


def _matmul(g, case, xs):
    a, b = xs
    bt = g.not_transposed(g.transpose(b))
    if _matmul_order(case) == 1:
        return g.mul_mat(bt, a)
    return g.transpose(g.mul_mat(g.not_transposed(a), bt))


def _softmax(g, case, xs):
    """ggml_soft_max_ext(cont(x), mask, scale, max_bias), then ggml_soft_max_add_sinks(.,
    sinks) for a case with sinks. ggml asserts a contiguous mask whose rows have x's length
    (mask ne[0] == x ne[0]) and cover x's rows (ne[1] >= x's), and broadcasts its ne[2],
    ne[3] by index modulo; a mask that numpy broadcasts along its rows or columns is first
    repeated to x's (ggml_repeat_4d), as a ggml user would. A permuted or sliced mask is
    copied by ggml_cont first, always: the mask is not differentiated, and ggml_repeat's
    kernel asserts nb[0] == 4 even for a view that ggml_is_contiguous accepts (ne[0] == 1),
    which would make this a check of ggml_repeat instead of soft_max. The zero mask of one
    element that our softmax gives sinks without a mask is NULL (ggml's own form). The
    sinks (ne[0] == x's ne[2], the heads, as ours) are F32, as ggml asserts."""
    kw = case.kwargs
    x = g.contiguous(xs[0])
    mask = None
    if len(xs) > 1 and not _no_mask(case.inputs[1]):
        mask = g.cont(xs[1]) if case.inputs[1].is_view else xs[1]
        xn, mn = g.ne(x), g.ne(mask)
        if mn[:2] != xn[:2]:
            mask = g.repeat_4d(mask, xn[0], xn[1], mn[2], mn[3])
    out = g.soft_max_ext(x, mask, kw["scale"], kw.get("max_bias", 0.0))
    if len(xs) > 2:
        g.lib.ggml_soft_max_add_sinks(out, xs[2])
    return out


def _no_mask(spec) -> bool:
    """Whether a softmax mask is the zero stand-in of sinks without a mask (engine.ops.
    softmax.sink_mask(None)): one element, zero, not differentiated."""
    return spec.shape == (1,) and spec.low == spec.high == 0.0 and not spec.grad


def _softmax_why_not(case):
    if case.kwargs.get("max_bias", 0.0) > 0.0:
        return ("ggml cannot differentiate ALiBi: soft_max's backward, ggml_soft_max_ext_back "
                "with the forward's max_bias, asserts it 0 in its CPU kernel (ggml-cpu/"
                "ops.cpp:5607 GGML_ASSERT(max_bias == 0.0f)), although x's gradient does not "
                "depend on the slopes")
    return None


# --- convolutions and pooling ---------------------------------------------------------------
def _windows(case):
    """(stride, padding, dilation) as (rows, cols) pairs."""
    kw = case.kwargs
    return (pair(case.op, "stride", kw.get("stride", 1)),
            pair(case.op, "padding", kw.get("padding", 0)),
            pair(case.op, "dilation", kw.get("dilation", 1)))


def _im2col(g, case, xs):
    (s, p, d), kw = _windows(case), case.kwargs
    kernel = g.from_numpy(np.zeros((1, case.inputs[0].shape[1], kw["kh"], kw["kw"])))
    return g.im2col(kernel, xs[0], s[1], s[0], p[1], p[0], d[1], d[0], True, GGML_TYPE_F32)


def _im2col_1d(g, case, xs):
    kw = case.kwargs
    kernel = g.from_numpy(np.zeros((case.inputs[0].shape[1], kw["k"])))
    return g.im2col(kernel, xs[0], kw["stride"], 0, kw["padding"], 0, kw["dilation"], 1,
                    False, GGML_TYPE_F32)


def _conv_2d(g, case, xs):
    x, w = xs
    s, p, d = _windows(case)
    return g.conv_2d(g.contiguous(w), x, s[1], s[0], p[1], p[0], d[1], d[0])


def _pool_2d(g, case, xs):
    kw = case.kwargs
    k = pair("pool_2d", "kernel", kw["kernel"])
    s = k if kw.get("stride") is None else pair("pool_2d", "stride", kw["stride"])
    p = pair("pool_2d", "padding", kw.get("padding", 0))
    mode = GGML_OP_POOL_MAX if kw["mode"] == "max" else GGML_OP_POOL_AVG
    return g.pool_2d(xs[0], mode, k[1], k[0], s[1], s[0], float(p[1]), float(p[0]))


def _acc_set(name):
    def build(g, case, xs):
        a, b = xs
        shape = case.inputs[0].shape
        if name == "acc":
            a = g.contiguous(a)          # ggml_acc_impl asserts ggml_is_contiguous(a)
        nb = (4,) + contiguous_nb(shape)  # of the result, a fresh contiguous copy of a
        return getattr(g, name)(a, b, *nb[1:], byte_offset(nb, shape, case.kwargs["offset"]))
    return build


def _block_why_not(case):
    p = case.inputs[0].permute
    if p is not None and p[-1] != len(p) - 1:
        return ("ggml_view_4d gives a view unit element stride (nb[0] = 4); a block of this "
                "permuted input has strided rows")
    return None


def _block(g, case, xs):
    x = xs[0]
    nb = list(g.lib.tensor(x).nb)
    offset = byte_offset(nb, case.inputs[0].shape, case.kwargs["offset"])
    return g.view_4d(x, *ne_of(case.kwargs["shape"]), nb[1], nb[2], nb[3], offset)


def _transpose(g, case, xs):
    n = len(case.inputs[0].shape)
    a, b = (case.kwargs.get(k, d) % n for k, d in (("axis1", -2), ("axis2", -1)))
    if {a, b} == {n - 2, n - 1}:
        return g.transpose(xs[0])
    axes = list(range(n))
    axes[a], axes[b] = axes[b], axes[a]
    return g.permuted(xs[0], axes)


def _cast(g, case, xs):
    """ggml_cast(x, type): a CPY into a new contiguous tensor of the target type (x may be a
    strided view: the copy walks its strides); to x's own type, ggml_dup(x) (ggml's DUP,
    the same copy as its own op)."""
    target = ggml_type(as_dtype(case.kwargs["dtype"]))
    return g.dup(xs[0]) if target == g.type(xs[0]) else g.cast(xs[0], target)


# --- the language-model ops (issue 20) ---------------------------------------------------
def _glu(name):
    """ggml_<name>_split(a, b) for two inputs; ggml_<name>[_swapped](x) for one (ggml_glu
    asserts rows contiguous: ggml_is_contiguous_1, hence cont for a strided view)."""
    def build(g, case, xs):
        if len(xs) == 2:
            a, b = (g.contiguous(x) for x in xs)
            return getattr(g, f"{name}_split")(a, b)
        swapped = "_swapped" if case.kwargs.get("swapped") else ""
        return getattr(g, f"{name}{swapped}")(g.contiguous(xs[0]))

    def why_not(case):
        if len(case.inputs) == 1:
            return (f"ggml differentiates {name} in its split form only (ggml_compute_backward "
                    "asserts 'backward pass only implemented for split swiglu'); the fused "
                    "form aborts")
        return None
    return GgmlOp(f"ggml_{name}_split(a, b)", build, why_not)


def _diag_mask(name):
    return GgmlOp(f"ggml_diag_mask_{name}(cont(x), n_past)", lambda g, case, xs: getattr(
        g, f"diag_mask_{name}")(g.contiguous(xs[0]), case.kwargs["n_past"]))


def _rope(g, case, xs):
    """ggml_rope_ext(x, pos, freq_factors or NULL, ...): x (T, H, D) or (B, T, H, D) is ggml's
    [D, H, T, B], one position per token (pos ne0 == x ne2)."""
    return rope_ext(g, xs[0], xs[1], xs[2] if len(xs) > 2 else None, case.kwargs)


def _win_part_why_not(case):
    shape = case.inputs[0].shape
    return None if len(shape) == 3 else (f"ggml_win_part takes one image [C, W, H, 1]; "
                                         f"here {list(shape)}")


def _shape_tensor(g, shape):
    return g.from_numpy(np.zeros(shape))


# --- the table ------------------------------------------------------------------------------
OPS: dict[str, GgmlOp] = {
    **{name: _unary(name, rows) for name, rows in (
        ("sqr", False), ("sqrt", False), ("log", False), ("sin", False), ("cos", False),
        ("abs", True), ("sgn", True), ("neg", True), ("step", True), ("relu", True),
        ("silu", True), ("exp", True), ("expm1", True), ("softplus", True))},
    "swiglu": _glu("swiglu"),
    "add1": GgmlOp("ggml_add1(a, b)", lambda g, case, xs: g.add1(xs[0], g.contiguous(xs[1]))),
    "diag_mask_inf": _diag_mask("inf"),
    "diag_mask_zero": _diag_mask("zero"),
    "rope": GgmlOp("ggml_rope_ext(x, pos, freq_factors or NULL, ...)", _rope),
    "win_part": GgmlOp("ggml_win_part(cont(x), w)", lambda g, case, xs: g.win_part(
        g.contiguous(xs[0]), case.kwargs["window"]), _win_part_why_not),
    "win_unpart": GgmlOp("ggml_win_unpart(cont(x), w0, h0, w)", lambda g, case, xs:
                         g.win_unpart(g.contiguous(xs[0]), case.kwargs["width"],
                                      case.kwargs["height"], case.kwargs["window"])),
    **{name: _binary(name, name in ("add", "mul")) for name in ("add", "sub", "mul", "div")},
    "scale": GgmlOp("ggml_scale (cont unless padded 1d)",
                    lambda g, case, xs: g.scale(g.padded_1d(xs[0]), case.kwargs["scale"])),
    "sum": GgmlOp("ggml_sum (all axes), ggml_sum_rows (last axis)", _sum, _reduce_why_not),
    "mean": GgmlOp("ggml_mean (last axis; all axes: of ggml_reshape_1d)", _mean,
                   _reduce_why_not),
    "sum_rows": GgmlOp("ggml_sum_rows", lambda g, case, xs: g.sum_rows(xs[0])),
    "repeat": GgmlOp("ggml_repeat_4d", lambda g, case, xs: g.repeat_4d(
        xs[0], *ne_of(case.kwargs["shape"]))),
    "broadcast_to": GgmlOp("ggml_repeat_4d", lambda g, case, xs: g.repeat_4d(
        xs[0], *ne_of(case.kwargs["shape"]))),
    "repeat_back": GgmlOp("ggml_repeat_back", lambda g, case, xs: g.repeat_back(
        xs[0], _shape_tensor(g, case.kwargs["shape"]))),
    "get_rows": GgmlOp("ggml_get_rows ((B, K) indices flattened, rows reshaped)", _get_rows),
    "matmul": GgmlOp("ggml_mul_mat(cont(b^T), a), or its transpose", _matmul,
                     _matmul_why_not),
    "softmax": GgmlOp("ggml_soft_max_ext(cont(x), mask (cont if permuted, repeated to x's "
                      "if broadcast along its rows or columns) or NULL, scale, max_bias), "
                      "ggml_soft_max_add_sinks(., sinks) with sinks", _softmax,
                      _softmax_why_not),
    "cross_entropy_loss": GgmlOp("ggml_cross_entropy_loss", lambda g, case, xs:
                                 g.cross_entropy_loss(g.contiguous(xs[0]),
                                                      g.contiguous(xs[1]))),
    "rms_norm": GgmlOp("ggml_rms_norm(cont(x), eps)", lambda g, case, xs: g.rms_norm(
        g.contiguous(xs[0]), case.kwargs["eps"])),
    "im2col": GgmlOp("ggml_im2col(is_2D, F32)", _im2col,
                     lambda case: None if case.kwargs.get("layout", "NHWK") == "NHWK" else
                     "ggml_im2col writes its columns (N, OH, OW, C*KH*KW) only; the case "
                     "asks for layout NKHW"),
    "im2col_1d": GgmlOp("ggml_im2col(1-D, F32)", _im2col_1d),
    "conv_2d": GgmlOp("ggml_conv_2d(cont(w), x)", _conv_2d),
    "pool_2d": GgmlOp("ggml_pool_2d", _pool_2d),
    "permute": GgmlOp("ggml_permute", lambda g, case, xs: g.permuted(
        xs[0], [a % len(case.inputs[0].shape) for a in case.kwargs["axes"]])),
    "transpose": GgmlOp("ggml_transpose (last two axes), else ggml_permute", _transpose),
    "cont": GgmlOp("ggml_cont", lambda g, case, xs: g.cont(xs[0])),
    "cast": GgmlOp("ggml_cast (GGML_OP_CPY); to the same type ggml_dup (GGML_OP_DUP)", _cast),
    "acc": GgmlOp("ggml_acc(cont(a), b, nb1, nb2, nb3, offset)", _acc_set("acc")),
    "set": GgmlOp("ggml_set(a, b, nb1, nb2, nb3, offset)", _acc_set("set")),
    "block": GgmlOp("ggml_view_4d", _block, _block_why_not),
    "reshape": GgmlOp("ggml_reshape_4d (cont if strided)", lambda g, case, xs: g.reshape_4d(
        g.contiguous(xs[0]), *ne_of(_reshaped(case)))),
}

def _reshaped(case):
    shape = list(case.kwargs["shape"])
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(case.inputs[0].shape)) // known
    return tuple(shape)


# attention (unfused; flash attention forward only) and llama.cpp's decoder blocks: their
# own module, imported last (it needs nothing of this one)
from gradcheck.adapters.ggml.attention import ROWS as _ATTENTION_ROWS  # noqa: E402

OPS.update({name: GgmlOp(*row) for name, row in _ATTENTION_ROWS.items()})
