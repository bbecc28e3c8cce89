"""torch autograd as the engine under test.

For a registry case (`gradcheck --engine torch --op softmax`) it runs the op's torch
equivalent, in the case's dtypes (float32 stays float32), on tensors that require grad, and
returns the gradient of sum(output * weights) that torch's backward computes. Inputs that
the op sees permuted are made as permuted views of tensors in the leaf layout, so torch's
non-contiguous paths are exercised as ours are; so are sliced (offset, strided) and expanded
(stride-0) inputs, as torch slices and expands of their leaves.

With `fn`, any torch callable (tensors in, one tensor out), custom torch.autograd.Function
included, is run instead of the registry's equivalent: see gradcheck.api.check_torch.

Forward mode is torch's forward-mode AD (torch.autograd.forward_ad: each op's, or a
Function's, `jvp` rule); second order is torch's double backward ("rev-rev": autograd.grad with
create_graph, then the gradient of <grad, v>) and forward over reverse ("fwd-rev":
torch.func.jvp of torch.func.grad). A function torch cannot differentiate so (a Function
without a `jvp` rule, an op without a double backward) is Unsupported, with torch's reason.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.tensor import DTYPES
from gradcheck.adapters.base import JVP, VJP, Unsupported, cotangent_axes, sliced_weights


def as_torch(a: np.ndarray):
    """A torch tensor of numpy array `a`, bfloat16 (ml_dtypes') included, which torch.tensor
    refuses: its bit patterns, reinterpreted. Always a contiguous copy: torch.tensor keeps
    a strided array's layout, and some of torch's backward kernels refuse strided leaves
    (conv_transpose2d's: "grad_weight needs to be contiguous")."""
    import torch
    a = np.array(a, order="C")          # (np.ascontiguousarray makes a 0-d array 1-d)
    if a.dtype == DTYPES["bf16"]:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_torch(t) -> np.ndarray:
    """A numpy array of torch tensor `t` (detached), bfloat16 as ml_dtypes' bfloat16."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(DTYPES["bf16"])
    return t.numpy()


def upstream_gradient(torch, weights: np.ndarray, cotangent: str, dtype):
    """The weights as the torch tensor handed to backward: contiguous, a permuted view of a
    copy stored in reversed axis order, a stride-0 expansion along the last axis, or the
    middle of a larger buffer (see gradcheck.adapters.base.cotangent_view)."""
    w = torch.from_numpy(np.asarray(weights, np.float64)).to(dtype)
    if cotangent == "permuted" and w.ndim >= 2:
        axes = cotangent_axes(w.ndim)
        return w.permute(axes).contiguous().permute(tuple(int(i) for i in np.argsort(axes)))
    if cotangent == "expanded" and w.ndim >= 1:     # storage of one column only
        return w[..., :1].contiguous().expand(tuple(w.shape))
    if cotangent == "expanded_first" and w.ndim >= 1:   # storage of one row only
        return w[:1].contiguous().expand(tuple(w.shape))
    if cotangent == "sliced" and w.ndim >= 1:       # the middle of a larger buffer
        big = torch.from_numpy(sliced_weights(np.asarray(weights, np.float64))).to(dtype)
        return big[(slice(1, -1),) * w.ndim]
    return w


def torch_view(spec, leaf):
    """The view the op sees of torch tensor `leaf` (engine.samples.InputSpec's layout): a
    permute, a slice (an offset and strides) or an expand (stride 0) of it."""
    if getattr(spec, "permute", None):
        return leaf.permute(spec.permute)
    if getattr(spec, "slice", None):
        leaf = leaf[tuple(slice(*t) for t in spec.slice)]
    if getattr(spec, "expand", None):
        leaf = leaf.expand(tuple(spec.shape))
    return leaf


class TorchAdapter:
    name = "torch"
    isolated = False
    leaf_gradients = True      # it builds the input views (gradcheck.adapters.base)
    backend = "cpu"

    def __init__(self, fn: Callable | None = None):
        import torch  # noqa: F401  (a missing torch fails here, as a set-up error)
        self.fn = fn

    def describe(self) -> str:
        import torch
        what = f", function {getattr(self.fn, '__name__', repr(self.fn))}" if self.fn else ""
        return f"torch {torch.__version__} (autograd on CPU{what})"

    def _function(self, case):
        if self.fn is not None:
            return self.fn, {}
        return case.torch_fn, dict(getattr(case, "kwargs", {}))

    def unsupported(self, case) -> str | None:
        if self._function(case)[0] is None:
            return f"op {case.op} has no torch equivalent in the registry"
        return None

    def forward(self, case, arrays) -> np.ndarray:
        """The output alone, in the inputs' dtypes, with no backward pass: how a dedicated
        backward op runs (gradcheck.backward_ops; softmax_sink_back's torch equivalent is
        itself an autograd.grad, whose result has no gradient to take)."""
        import torch
        fn, kwargs = self._function(case)
        views = [torch_view(spec, as_torch(spec.to_leaf(np.asarray(a))))
                 for spec, a in zip(case.inputs, arrays, strict=True)]
        with torch.no_grad():
            out = fn(*views, **kwargs)
        return from_torch(out).copy()

    def vjp(self, case, arrays, weights) -> VJP:
        """torch's gradient of sum(fn(*inputs) * weights), in the inputs' dtypes."""
        import torch
        fn, kwargs = self._function(case)
        leaves, views = [], []
        for spec, a in zip(case.inputs, arrays, strict=True):
            leaf = as_torch(spec.to_leaf(np.asarray(a)))   # a copy
            if spec.grad and leaf.dtype.is_floating_point:
                leaf.requires_grad_(True)
            leaves.append(leaf)
            views.append(torch_view(spec, leaf))
        out = fn(*views, **kwargs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{case}: the torch function returned {type(out).__name__}, "
                            "not a tensor")
        grads: list[np.ndarray | None] = [None] * len(leaves)
        if out.dtype.is_floating_point and any(t.requires_grad for t in leaves):
            w = np.asarray(weights, np.float64).reshape(tuple(out.shape))
            cotangent = getattr(case, "cotangent", "contiguous")
            if cotangent == "contiguous":
                (out * torch.from_numpy(w).to(out.dtype)).sum().backward()
            else:                 # the upstream gradient as a strided or stride-0 view
                out.backward(gradient=upstream_gradient(torch, w, cotangent, out.dtype))
            grads = [None if not t.requires_grad else spec.from_leaf(
                        from_torch(t.grad) if t.grad is not None else np.zeros(
                            tuple(t.shape), from_torch(t).dtype))
                     for spec, t in zip(case.inputs, leaves, strict=True)]
        return VJP(from_torch(out).copy(), grads)

    hvp_methods = ("rev-rev", "fwd-rev")

    def _leaves(self, case, arrays):
        """(fn, kwargs, leaves, checked): the case's torch function and its leaves, copies of
        `arrays` in the leaf layout; checked: the indices of the float inputs with grad."""
        fn, kwargs = self._function(case)
        leaves = [as_torch(spec.to_leaf(np.asarray(a)))
                  for spec, a in zip(case.inputs, arrays, strict=True)]
        checked = [i for i, (spec, t) in enumerate(zip(case.inputs, leaves, strict=True))
                   if spec.grad and t.dtype.is_floating_point]
        return fn, kwargs, leaves, checked

    def _forward_of(self, case, fn, kwargs, leaves, checked):
        """f(*checked leaves) -> output: the case's function of its checked leaves (the
        others held), each viewed as the op sees it."""
        def forward(*diff):
            values = list(leaves)
            for i, t in zip(checked, diff, strict=True):
                values[i] = t
            return fn(*(torch_view(spec, t) for spec, t in zip(case.inputs, values,
                                                                strict=True)), **kwargs)
        return forward

    def jvp(self, case, arrays, tangents) -> JVP:
        """torch's forward-mode derivative of the output along `tangents`, in the inputs'
        dtypes (torch.autograd.forward_ad's dual tensors: each op's, or a Function's, `jvp`
        rule; lighter than torch.func.jvp, which takes the same rules)."""
        import torch.autograd.forward_ad as fwad
        fn, kwargs, leaves, checked = self._leaves(case, arrays)
        forward = self._forward_of(case, fn, kwargs, leaves, checked)
        tans = [as_torch(np.asarray(case.inputs[i].to_leaf(np.asarray(tangents[i])),
                                    arrays[i].dtype)) for i in checked]
        try:
            with fwad.dual_level():
                duals = [fwad.make_dual(leaves[i], t) for i, t in zip(checked, tans,
                                                                       strict=True)]
                out = forward(*duals)
                primal, tangent = fwad.unpack_dual(out)
        except (NotImplementedError, RuntimeError) as exc:
            raise Unsupported(f"torch has no forward-mode derivative here: "
                              f"{_first_line(exc)}") from None
        if tangent is None:             # the output does not depend on the inputs
            tangent = primal.new_zeros(primal.shape)
        return JVP(from_torch(primal).copy(), from_torch(tangent).copy())

    def hvp(self, case, arrays, weights, direction, method: str = "rev-rev") -> VJP:
        """torch's gradient of <grad loss, direction> (loss = sum(output * weights)) per
        checked input, by `method` (hvp_methods), in the inputs' dtypes."""
        import torch
        fn, kwargs, leaves, checked = self._leaves(case, arrays)
        forward = self._forward_of(case, fn, kwargs, leaves, checked)
        primals = tuple(leaves[i] for i in checked)
        dirs = tuple(as_torch(np.asarray(case.inputs[i].to_leaf(np.asarray(direction[i])),
                                         arrays[i].dtype)) for i in checked)
        w_np = np.asarray(weights, np.float64)

        def loss(*diff):
            out = forward(*diff)
            return (out * torch.from_numpy(w_np.reshape(tuple(out.shape))).to(out.dtype)).sum()
        try:
            if method == "rev-rev":
                xs = [p.detach().clone().requires_grad_(True) for p in primals]
                grads = torch.autograd.grad(loss(*xs), xs, create_graph=True,
                                            allow_unused=True)
                s = sum((g * d).sum() for g, d in zip(grads, dirs, strict=True)
                        if g is not None and g.requires_grad)
                hv = ([None] * len(xs) if not torch.is_tensor(s) else
                      torch.autograd.grad(s, xs, allow_unused=True))
            elif method == "fwd-rev":
                grad = torch.func.grad(loss, argnums=tuple(range(len(primals))))
                _, hv = torch.func.jvp(grad, primals, dirs)
            else:
                raise ValueError(f"torch's second-order methods are {self.hvp_methods}, "
                                 f"not {method!r}")
            with torch.no_grad():
                out = forward(*primals)
        except (NotImplementedError, RuntimeError) as exc:
            raise Unsupported(f"torch cannot take this second derivative ({method}): "
                              f"{_first_line(exc)}") from None
        result: list[np.ndarray | None] = [None] * len(leaves)
        for i, h in zip(checked, hv, strict=True):
            # torch answers a zero second derivative with None or a ZeroTensor (abs')
            h = (np.zeros(tuple(leaves[i].shape), from_torch(leaves[i]).dtype)
                 if h is None or h._is_zerotensor() else from_torch(h).copy())
            result[i] = case.inputs[i].from_leaf(h)
        return VJP(from_torch(out).copy(), result)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
