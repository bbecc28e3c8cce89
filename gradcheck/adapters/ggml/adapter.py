"""GgmlAdapter: one gradcheck case as a ggml graph, computed forward and backward on the CPU.

For a case with inputs x_i (param leaves where checked; permuted inputs are ggml_permute
views of a leaf stored in the other axis order, sliced ones ggml_view_4d views of a larger
leaf, at an offset and with strides; expanded ones, stride 0, are unsupported: ggml has no
such views) and the op's output y, the graph is

    loss = ggml_sum(ggml_mul(w, y))          w: the given weights, an input tensor

flagged as the loss (w first: ggml's CPU binary kernels take a strided second operand but
assert contiguous rows in the first, and y may be a strided view, as for permute).
ggml_build_forward_expand and ggml_build_backward_expand make the forward and backward
graphs; ggml_graph_reset seeds d loss = 1; ggml_graph_compute_with_ctx runs it on the CPU.
The VJP's gradients are ggml_graph_get_grad of each param leaf (zeros where no gradient
reaches a leaf, as for sgn and step), put into the layout the op sees. The graph is computed
twice; `differs` says whether the two runs gave different bits. Inputs whose gradient ggml
does not compute (coverage.DECLINED: soft_max's mask) are declined (`declined`) and not params.

ggml has no float64: f64 cases are unsupported. 16-bit inputs are GGML_TYPE_F16 and
GGML_TYPE_BF16 tensors holding the case's values bit for bit (graph.py); the op's output, of
whatever type ggml gives it (F32 for mul_mat and get_rows of F16, F16 for an F16 unary op),
is read through ggml_cast to F32 (exact) into the loss, and the gradients are read back in
the type ggml computes them (F32 for most: coverage.py). ggml differentiates through F16
tensors only (coverage.F16_OPS says which ops have F16 kernels in both passes, F16_NO_KERNEL
which abort); bf16 cases are unsupported (coverage.BF16_NO_BACKWARD) and `forward_only`
runs them forward. ggml's own mixed case, mul_mat of 16-bit weights and float32 activations,
is the registry's matmul with b in 16 bits (`b:f16=[K,N]perm[1,0]`, ggml's weight layout).

ggml_flash_attn_ext, which ggml cannot differentiate, computes attention cases forward
only: `forward_only_checks` and `forward_only_output` (gradcheck.forward_only; attention.py).

A failed GGML_ASSERT aborts the process, so the adapter is `isolated`: gradcheck runs its
cases in worker processes.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from checkkit import ggml as ggml_lib
from checkkit.ggml import GGML_TYPE_F32, GGML_TYPE_I32, MAX_DIMS
from engine.tensor import is_float
from gradcheck.adapters.base import VJP, cotangent_axes, sliced_weights
from gradcheck.adapters.ggml import attention as ggml_attention
from gradcheck.adapters.ggml.coverage import DECLINED, F16_OPS, NO_BACKWARD, half_unsupported
from gradcheck.adapters.ggml.graph import (
    GRAPH_SIZE,
    Context,
    byte_offset,
    contiguous_nb,
    ggml_type,
    ne_of,
    same_layout,
)
from gradcheck.adapters.ggml.ops import OPS

BASE_MEMORY = 16 << 20      # bytes: graph and tensor headers, compute work buffer
MEMORY_PER_BYTE = 64        # context bytes per byte of the case's inputs, output, columns


def _case_bytes(case, weights_size: int) -> int:
    """Float32 bytes of the case's inputs and output, plus im2col's columns for conv_2d."""
    n = weights_size + sum(int(np.prod(getattr(spec, "leaf_shape", spec.shape)))
                           for spec in case.inputs)     # a sliced input's leaf is larger
    if case.op == "conv_2d":
        _, c, _, _ = case.inputs[0].shape
        _, _, kh, kw = case.inputs[1].shape
        o = case.inputs[1].shape[0]
        n += weights_size // max(o, 1) * c * kh * kw
    return 4 * n


class GgmlAdapter:
    """gradcheck's adapter for ggml's CPU backend through its C API.

    lib_dir: a directory holding libggml-base.so and libggml-cpu.so (a user's build);
    None: the libraries of the PyPI wheel libggml-python. n_threads: ggml's compute
    threads (default: up to 4 of this machine's cores). Loading errors raise AdapterError.
    """

    name = "ggml"
    isolated = True
    leaf_gradients = True      # it builds the input views (gradcheck.adapters.base)

    def __init__(self, lib_dir: str | None = None, n_threads: int | None = None):
        self.lib_dir = lib_dir
        self.n_threads = n_threads or max(1, min(4, os.cpu_count() or 1))
        self.lib = ggml_lib.load(lib_dir)

    # the thread counts of gradcheck's scale tier: ggml's CPU kernels split rows over its
    # threads, and a bug of a split shows at some counts only
    thread_counts = (1, 4)

    def with_threads(self, n: int) -> GgmlAdapter:
        """The same ggml, computing with `n` threads."""
        return GgmlAdapter(self.lib_dir, n)

    def vjp_at_threads(self, n: int, case, arrays, weights) -> VJP:
        """vjp with `n` threads (what an isolated worker runs for with_threads(n))."""
        return self.with_threads(n).vjp(case, arrays, weights)

    def __getstate__(self):
        return {"lib_dir": self.lib_dir, "n_threads": self.n_threads}

    def __setstate__(self, state):
        self.__init__(state["lib_dir"], state["n_threads"])

    def describe(self) -> str:
        return (f"ggml {self.lib.version} (commit {self.lib.commit}, {self.lib.directory}, "
                f"{self.n_threads} threads)")

    def unsupported(self, case) -> str | None:
        if "f64" in case.float_dtypes:
            return "ggml computes in f32; the case is f64"
        op = OPS.get(case.op)
        if op is None:
            if case.op in NO_BACKWARD:
                return (f"ggml has no backward for {NO_BACKWARD[case.op]}: "
                        "ggml_build_backward_expand aborts on it")
            return f"ggml has no op for {case.op}"
        for spec in case.inputs:
            if len(spec.shape) > MAX_DIMS:
                return (f"ggml tensors have at most {MAX_DIMS} dimensions; input "
                        f"{spec.name} has shape {list(spec.shape)}")
        return (half_unsupported(case) or view_unsupported(case, self.declined(case))
                or op.why_not(case))

    def declined(self, case) -> dict[str, str]:
        """Inputs of `case` whose gradient ggml does not compute, with the reason (see
        gradcheck.adapters.base): soft_max's mask, cross_entropy_loss's labels."""
        reasons = DECLINED.get(case.op, {})
        return {spec.name: reasons[spec.name] for spec in case.inputs if spec.name in reasons}

    def _memory(self, case, weights_size: int) -> int:
        return (BASE_MEMORY + self.lib.ggml_graph_overhead_custom(GRAPH_SIZE, True)
                + 4 * GRAPH_SIZE * self.lib.ggml_tensor_overhead()
                + MEMORY_PER_BYTE * _case_bytes(case, weights_size))

    def forward_unsupported(self, case) -> str | None:
        """Why ggml cannot run `case` forward (its backward may still be missing: bf16)."""
        if "f64" in case.float_dtypes:
            return "ggml computes in f32; the case is f64"
        if case.op not in OPS or (case.float_dtypes & {"f16", "bf16"}
                                  and case.op not in F16_OPS):
            return self.unsupported(case)
        return None

    def forward_only(self, case, arrays, shape) -> np.ndarray:
        """The case's output (of numpy `shape`) computed by ggml's forward pass alone (no
        params, no backward graph), in the type ggml gives it: the one way to see ggml's
        bf16 kernels, which have no backward (coverage.BF16_NO_BACKWARD). For tests; the
        caller must know that the case does not abort (it runs in this process)."""
        why = self.forward_unsupported(case)
        if why:
            raise ValueError(f"ggml cannot run {case} forward: {why}")
        with Context(self.lib, self._memory(case, 0)) as g:
            _, views = _inputs(g, case, arrays, [spec.name for spec in case.inputs])
            return self._forward(g, OPS[case.op].build(g, case, views), shape)

    def _forward(self, g: Context, out, shape) -> np.ndarray:
        """Tensor `out` of context g computed by a forward graph alone, as numpy `shape`."""
        g.lib.ggml_set_output(out)
        graph = g.lib.ggml_new_graph_custom(g.ctx, GRAPH_SIZE, False)
        g.lib.ggml_build_forward_expand(graph, out)
        status = g.lib.ggml_graph_compute_with_ctx(g.ctx, graph, self.n_threads)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned status {status}")
        return g.to_numpy(out, shape)

    def forward_only_checks(self, case) -> dict[str, str | None]:
        """ggml's ops with no backward that compute `case`'s op, checked forward alone
        (gradcheck.forward_only): ggml_flash_attn_ext for attention, with the reason it
        cannot run a case (None when it can); none for a case that differs from another
        in its cotangent only (the forward is the same)."""
        if case.op != "attention" or getattr(case, "cotangent", "contiguous") != "contiguous":
            return {}
        return {ggml_attention.FLASH: ggml_attention.flash_why_not(case)}

    def forward_only_output(self, variant, case, arrays):
        """(output, input values computed on) of `variant` on `case` (see
        forward_only_checks): ggml_flash_attn_ext's, its mask rounded to F16."""
        if variant != ggml_attention.FLASH:
            raise ValueError(f"ggml has no forward-only variant {variant!r}")
        seen = ggml_attention.flash_inputs(case, [np.asarray(a) for a in arrays])
        qkv = dataclasses.replace(case, inputs=case.inputs[:3])
        q, v = seen[0].shape, seen[2].shape
        rows = int(np.prod(q[:-1]))            # the output's and the broadcast mask's rows
        with Context(self.lib, self._memory(case, rows * (v[-1] + v[-2]))) as g:
            _, views = _inputs(g, qkv, seen[:3], [spec.name for spec in qkv.inputs])
            out = ggml_attention.flash(g, case, views, seen)
            return self._forward(g, out, (*q[:-1], v[-1])), seen

    def vjp(self, case, arrays, weights) -> VJP:
        why = self.unsupported(case)
        if why:
            raise ValueError(f"ggml cannot run {case}: {why}")
        weights = np.asarray(weights)
        mem = self._memory(case, weights.size)
        leaf_shapes = [spec.to_leaf(np.asarray(a)).shape
                       for spec, a in zip(case.inputs, arrays, strict=True)]
        with Context(self.lib, mem) as g:
            leaves, views = _inputs(g, case, arrays, self.declined(case))
            out = OPS[case.op].build(g, case, views)
            ne = g.ne(out)
            if not same_layout(ne, weights.shape):
                raise RuntimeError(f"ggml's output of {case} has ne {list(ne)}, which is not "
                                   f"the case's output shape {list(weights.shape)}")
            g.build(g.sum(_weighted(g, out, weights.reshape(tuple(reversed(ne))),
                                    getattr(case, "cotangent", "contiguous"))))
            grads = [None if leaf is None else g.grad(leaf) for leaf in leaves]
            # tensors read back are outputs, which ggml's CPU backend never fuses away (an
            # RMS_NORM whose only user is a MUL is computed as one op, into the MUL's memory)
            for t in [out] + [grad for grad in grads if grad is not None]:
                g.lib.ggml_set_output(t)

            def run():
                g.compute(self.n_threads)
                return [g.to_numpy(out, weights.shape)] + [
                    None if leaf is None else np.zeros(shape, np.float32) if grad is None
                    else g.to_numpy(grad, shape)
                    for leaf, grad, shape in zip(leaves, grads, leaf_shapes, strict=True)]
            first, second = run(), run()
        differs = any(a is not None and not np.array_equal(a, b, equal_nan=True)
                      for a, b in zip(first, second, strict=True))
        return VJP(first[0], [None if x is None else spec.from_leaf(x)
                              for spec, x in zip(case.inputs, first[1:], strict=True)], differs)


def _weighted(g: Context, out, weights: np.ndarray, cotangent: str):
    """ggml_mul(w, y') with y' the op's output read in the case's cotangent layout: y itself;
    for "permuted", ggml_cont of its permute with the numpy axes reversed (its backward hands
    the op a permuted gradient, as the MNIST CNN's flatten does); for "expanded",
    ggml_sum_rows of it (sum over the last numpy axis: the op gets the weights repeated); for
    "sliced", ggml_acc of it into the middle of a zero tensor one larger on each side (ACC's
    backward hands the op a ggml_view of the larger gradient, at an offset).
    A 16-bit y is read through ggml_cast to F32 (exact), after the permute's cont (CPY's
    backward reshapes its gradient, which asserts a contiguous one) and before the rest (no
    F16 kernel for sum_rows or acc); the cast's backward hands y its F32 gradient."""
    if cotangent == "permuted" and weights.ndim >= 2:
        axes = cotangent_axes(weights.ndim)
        return g.mul(g.from_numpy(weights.transpose(axes), GGML_TYPE_F32),
                     g.as_f32(g.cont(g.permuted(out, axes))))
    out = g.as_f32(out)
    if cotangent == "expanded" and weights.ndim >= 1:
        return g.mul(g.from_numpy(weights[..., :1], GGML_TYPE_F32),
                     g.sum_rows(g.contiguous(out)))
    if cotangent == "expanded_first" and weights.ndim >= 1:   # the first axis made the last
        axes = cotangent_axes(weights.ndim)
        return g.mul(g.from_numpy(weights.transpose(axes)[..., :1], GGML_TYPE_F32),
                     g.sum_rows(g.cont(g.permuted(out, axes))))
    if cotangent == "sliced" and weights.ndim >= 1:
        big = sliced_weights(weights)
        zeros = g.from_numpy(np.zeros(big.shape, np.float32), GGML_TYPE_F32)
        nb = contiguous_nb(big.shape)
        offset = byte_offset((4, *nb), big.shape, (1,) * big.ndim)
        return g.mul(g.from_numpy(big, GGML_TYPE_F32),
                     g.acc(zeros, g.contiguous(out), *nb, offset))
    return g.mul(g.from_numpy(weights, GGML_TYPE_F32), out)


def _inputs(g: Context, case, arrays, declined=()):
    """(leaves, views): per input, its param leaf (None if unchecked or `declined`) and the
    tensor the op receives: the leaf, a ggml_permute or ggml_view_4d view of it, or an I32
    tensor of index values; an input that is not a param and has no ggml view (expanded)
    as its values, contiguous."""
    leaves, views = [], []
    for spec, a in zip(case.inputs, arrays, strict=True):
        a = np.asarray(a)
        if not is_float(a.dtype):
            leaves.append(None)
            views.append(g.from_numpy(a, GGML_TYPE_I32))
            continue
        leaf = g.from_numpy(spec.to_leaf(a), ggml_type(a.dtype))
        param = spec.grad and spec.name not in declined
        if param:
            g.lib.ggml_set_param(leaf)
        leaves.append(leaf if param else None)
        no_view = not param and _no_view(spec)
        views.append(g.from_numpy(a, ggml_type(a.dtype)) if no_view
                     else _view(g, spec, leaf))
    return leaves, views


def _view(g: Context, spec, leaf):
    """The tensor the op receives for `leaf`: the leaf, its ggml_permute view, or for a
    sliced input its ggml_view_4d, with the leaf's strides times the steps (ggml nb[1..3])
    at the byte offset of the slice's start."""
    if spec.permute:
        return g.permuted(leaf, spec.permute)
    if not spec.slice:
        return leaf
    leaf_shape = spec.leaf_shape
    size = g.itemsize(leaf)
    nb = (size, *contiguous_nb(leaf_shape, size))
    k = len(leaf_shape)
    steps = [t[2] for t in reversed(spec.slice)] + [1] * (MAX_DIMS - k)   # ggml order
    view_nb = [nb[i] * steps[i] for i in range(1, MAX_DIMS)]
    offset = byte_offset(nb, leaf_shape, [t[0] for t in spec.slice])
    return g.view_4d(leaf, *ne_of(spec.shape), *view_nb, offset)


def _no_view(spec) -> str | None:
    """Why ggml has no view of a leaf such as `spec`'s, or None."""
    if getattr(spec, "expand", None):
        return (f"input {spec.name} is expanded (stride 0): ggml_view_* asserts that a "
                "view's contiguous size fits its source, so ggml has no stride-0 views")
    if getattr(spec, "slice", None) and spec.slice[-1][2] != 1:
        return (f"input {spec.name} is sliced with a step along its last axis: "
                "ggml_view_4d gives a view unit element stride (nb[0] = the type's size)")
    return None


def view_unsupported(case, declined=()) -> str | None:
    """Why ggml cannot give the op one of the case's differentiated input views, or None
    (an input that is not differentiated, or `declined`, is handed over as its values)."""
    for spec in case.inputs:
        why = spec.grad and spec.name not in declined and _no_view(spec)
        if why:
            return why
    return None
