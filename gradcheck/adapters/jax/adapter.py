"""JaxAdapter: a registry case's jax equivalent under jax.vjp, on jax's CPU device.

For a case it runs the op's jax equivalent (gradcheck.adapters.jax.ops and .nn) in the
case's dtypes (x64 enabled, so float64 stays float64; float16 and bfloat16 as jax has them)
and returns the output and jax.vjp's pullback of the loss weights (cast to the output's
dtype): the gradient of sum(output * weights) with respect to each checked input. Integer
inputs (indices, positions) and inputs whose spec has grad False are held constant.

The forward and its VJP are one jax.jit-compiled function per op, parameters, input shapes
and dtypes (gradcheck runs each case twice: the second run reuses it), kept in jax's
persistent compilation cache under <cache>/jax (checkkit.cache) unless the user has chosen
a cache directory for jax.

Unsupported, with the reason in the row:
- layouts: jax arrays have no strides, so a case whose inputs are permuted, sliced or
  expanded views of their leaves, or whose upstream gradient is not contiguous, would only
  repeat its contiguous case (not applicable);
- the dedicated backward ops without a backward of their own (softmax_back, norm_back,
  pool_2d_back, the activations' `<name>_back`, ...): jax has no op of its own for them;
  their forward op's cases check jax's VJP;
- an op with no jax equivalent here (a new registry op).

Forward mode is jax.jvp; second order is the gradient of <grad loss, v> by jax.grad
("rev-rev", reverse over reverse) and jax.jvp of jax.grad ("fwd-rev", forward over
reverse), each jit-compiled as the VJP is. Once forward mode is in use (a first jvp call),
a fast-tier case's VJP and JVP are compiled as one function (see JaxAdapter._fused): about
what the VJP alone costs to trace and lower, where two functions cost 1.9x.
"""

from __future__ import annotations

import collections
import os

import numpy as np

from checkkit.cache import default_cache_dir
from engine.registry import get_op
from engine.tensor import is_float
from gradcheck.adapters.base import JVP, VJP, AdapterError

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:      # the extra is not installed: JaxAdapter() says how to
    jax = jnp = None
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

INSTALL_HINT = ("jax is not installed (needs jax and jaxlib, CPU only): "
                "pip install 'gradverify[jax]'")
NO_STRIDES = "not applicable: jax arrays have no strides"
MAX_COMPILED = 64       # jit-compiled functions kept in the process (see _Compiled)


def jax_ops() -> dict:
    """Registry op name -> its jax equivalent, f(*inputs, **params)."""
    from gradcheck.adapters.jax import nn, ops
    return {**ops.OPS, **nn.OPS}


class JaxAdapter:
    name = "jax"
    isolated = False
    backend = "cpu"

    def __init__(self, jit: bool = True):
        if _MISSING is not None:
            raise AdapterError(f"engine 'jax': {INSTALL_HINT} ({_MISSING})")
        jax.config.update("jax_enable_x64", True)
        if jit:
            _persistent_cache()
        self.jit = jit
        self.device = jax.devices("cpu")[0]
        self.ops = jax_ops()
        self._compiled = _Compiled()
        self._outputs = _Compiled()         # jax.eval_shape of a case's output
        self._forward_mode = False          # a jvp call seen: see _fused

    def describe(self) -> str:
        return f"jax {jax.__version__} (jax.vjp on CPU{', jit' if self.jit else ''})"

    def function(self, case):
        """The case's jax equivalent, f(*inputs, **params); None where there is none."""
        return self.ops.get(case.op)

    def unsupported(self, case) -> str | None:
        views = [f"{spec.name} is a {_view_kind(spec)} view" for spec in case.inputs
                 if spec.is_view]
        if views:
            return f"{NO_STRIDES} ({', '.join(views)}; its contiguous case checks the op)"
        cotangent = getattr(case, "cotangent", "contiguous")
        if cotangent != "contiguous":
            return (f"{NO_STRIDES} (a {cotangent} upstream gradient is the contiguous one "
                    "in jax; its contiguous case checks the op)")
        if self.function(case) is None:
            opdef = get_op(case.op)
            if opdef.kind == "backward" and opdef.backward is None:
                forward = opdef.vjp_of.op if opdef.vjp_of else "its forward op"
                return (f"{case.op} is a dedicated backward op, which jax has no op of its "
                        f"own for: jax's VJP of {forward} is checked in {forward}'s cases")
            return f"op {case.op} has no jax equivalent in the jax adapter"
        return None

    def vjp(self, case, arrays, weights) -> VJP:
        """jax's output and gradient of sum(f(*inputs) * weights), in the inputs' dtypes."""
        arrays = [np.asarray(a) for a in arrays]
        checked = tuple(bool(spec.grad and is_float(a.dtype))
                        for spec, a in zip(case.inputs, arrays, strict=True))
        weights = np.asarray(weights, np.float64)
        fused, shape = self._fused(case, arrays, checked)
        with jax.default_device(self.device):
            if fused is None:
                out, grads = self._runner(case, arrays, checked)(tuple(arrays), weights)
            else:
                zeros = tuple(np.zeros_like(a) for ok, a in zip(checked, arrays,
                                                                strict=True) if ok)
                out, grads, _ = fused(tuple(arrays), weights.reshape(shape), zeros)
        out = np.asarray(out)
        grads = list(grads) if grads is not None else [None] * len(arrays)
        return VJP(out.copy(), [np.asarray(g).copy() if ok and g is not None else None
                                for ok, g in zip(checked, grads, strict=True)])

    def _runner(self, case, arrays, checked):
        """run(arrays, weights) -> (output, gradients or None): jit-compiled once per op,
        parameters, shapes and dtypes (and which inputs are checked)."""
        key = self._key(case, arrays, checked)
        if key in self._compiled:
            return self._compiled.get(key)
        of_checked = self._forward_of(case, checked)

        def run(values, weights):
            forward, diff = of_checked(values)
            if not diff:
                return forward(), None
            out, pullback = jax.vjp(forward, *diff)
            if not jnp.issubdtype(out.dtype, jnp.floating):
                return out, None
            return out, _pulled(pullback, out, weights, checked)
        if self.jit:
            run = jax.jit(run)
        self._compiled[key] = run
        return run

    hvp_methods = ("rev-rev", "fwd-rev")

    def jvp(self, case, arrays, tangents) -> JVP:
        """jax.jvp: the output and its derivative along `tangents`, in the inputs' dtypes."""
        arrays = [np.asarray(a) for a in arrays]
        checked = tuple(t is not None for t in tangents)
        tans = tuple(np.asarray(t, a.dtype) for t, a in zip(tangents, arrays, strict=True)
                     if t is not None)
        self._forward_mode = True
        fused, shape = self._fused(case, arrays, checked)
        with jax.default_device(self.device):
            if fused is None:
                out, tangent = self._derivative("jvp", case, arrays, checked)(
                    tuple(arrays), tans)
            else:
                out, _, (_, tangent) = fused(tuple(arrays), np.zeros(shape), tans)
        return JVP(np.asarray(out).copy(), np.asarray(tangent).copy())

    def _fused(self, case, arrays, checked):
        """(run, output shape): the case's VJP and JVP compiled as one function,
        run(arrays, weights, tangents) -> (output, gradients, (output, J t)), once forward
        mode is in use (a jvp call has been seen): each is then asked of every fast-tier
        case, and jit-compiling them together costs about what compiling the VJP alone does
        (the warm persistent cache still traces and lowers each function;
        `bench/bench_derivatives.py`). Each call computes both, the unused one of zero
        weights or tangents, the weights given in the output's shape so that both calls
        match one compiled signature. (None, None) where the case runs its own functions:
        before forward mode is asked, in the scale tier (which forward mode skips), with no
        checked input, or for an output that is not float."""
        if not (self._forward_mode and self.jit and any(checked)
                and getattr(case, "tier", "fast") == "fast"):
            return None, None
        output = self._output(case, arrays, checked)
        if not jnp.issubdtype(output.dtype, jnp.floating):
            return None, None
        key = ("vjp+jvp", *self._key(case, arrays, checked))
        if key in self._compiled:
            return self._compiled.get(key), output.shape
        forward_of = self._forward_of(case, checked)

        def run(values, weights, tangents):
            forward, diff = forward_of(values)
            out, pullback = jax.vjp(forward, *diff)
            return (out, _pulled(pullback, out, weights, checked),
                    jax.jvp(forward, diff, tangents))
        run = jax.jit(run)
        self._compiled[key] = run
        return run, output.shape

    def _output(self, case, arrays, checked):
        """The shape and dtype of the case's output (jax.eval_shape, kept per function)."""
        key = self._key(case, arrays, checked)
        if key not in self._outputs:
            forward, _ = self._forward_of(case, checked)(tuple(arrays))
            self._outputs[key] = jax.eval_shape(forward, *(
                a for ok, a in zip(checked, arrays, strict=True) if ok))
        return self._outputs[key]

    @staticmethod
    def _key(case, arrays, checked) -> tuple:
        """What one compiled function of a case is for: op, parameters, which inputs are
        checked, shapes and dtypes."""
        return (case.op, repr(case.params), checked,
                tuple((a.shape, a.dtype.str) for a in arrays))

    def _forward_of(self, case, checked):
        """of(values) -> (forward, checked values): the case's op as a function of its
        checked inputs alone, the others held at `values`."""
        fn, params = self.function(case), case.kwargs

        def of(values):
            def forward(*diff):
                it = iter(diff)
                return fn(*(next(it) if ok else v for ok, v in zip(checked, values,
                                                                   strict=True)), **params)
            return forward, tuple(v for ok, v in zip(checked, values, strict=True) if ok)
        return of

    def hvp(self, case, arrays, weights, direction, method: str = "rev-rev") -> VJP:
        """The gradient of <grad loss, direction> by `method` (hvp_methods), in the inputs'
        dtypes."""
        if method not in self.hvp_methods:
            raise ValueError(f"jax's second-order methods are {self.hvp_methods}, not "
                             f"{method!r}")
        arrays = [np.asarray(a) for a in arrays]
        checked = tuple(d is not None for d in direction)
        run = self._derivative(method, case, arrays, checked)
        dirs = tuple(np.asarray(d, a.dtype) for d, a in zip(direction, arrays, strict=True)
                     if d is not None)
        with jax.default_device(self.device):
            out, hv = run(tuple(arrays), np.asarray(weights, np.float64), dirs)
        got = iter(hv)
        return VJP(np.asarray(out).copy(), [np.asarray(next(got)).copy() if ok else None
                                            for ok in checked])

    def _derivative(self, kind, case, arrays, checked):
        """The jit-compiled forward-mode ("jvp") or second-order ("rev-rev", "fwd-rev")
        function of the case, once per op, parameters, shapes, dtypes and checked inputs."""
        key = (kind, *self._key(case, arrays, checked))
        if key in self._compiled:
            return self._compiled.get(key)
        of_checked = self._forward_of(case, checked)

        if kind == "jvp":
            def run(values, tangents):
                forward, diff = of_checked(values)
                return jax.jvp(forward, diff, tangents)
        else:
            def run(values, weights, dirs):
                forward, diff = of_checked(values)

                def loss(*d):
                    out = forward(*d)
                    return jnp.sum(out * weights.reshape(out.shape).astype(out.dtype))
                grad = jax.grad(loss, argnums=tuple(range(len(diff))))
                if kind == "fwd-rev":
                    hv = jax.jvp(grad, diff, dirs)[1]
                else:
                    def inner(*d):
                        return sum(jnp.sum(g * v) for g, v in zip(grad(*d), dirs,
                                                                 strict=True))
                    hv = jax.grad(inner, argnums=tuple(range(len(diff))))(*diff)
                return forward(*diff), hv
        if self.jit:
            run = jax.jit(run)
        self._compiled[key] = run
        return run


class _Compiled(collections.OrderedDict):
    """The adapter's jit-compiled functions, the MAX_COMPILED used last: XLA keeps each
    compiled executable in its own memory mappings, and a process that kept every one of
    a full `--all --ad both --order 2` run (some 20,000) ran out of them (the kernel's
    vm.max_map_count: "LLVM compilation error: Cannot allocate memory", then a
    segmentation fault). A function dropped here is freed with jax's caches of it; the
    persistent cache on disk keeps it for the next run."""

    def get(self, key, default=None):
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        while len(self) > MAX_COMPILED:
            self.popitem(last=False)


def _pulled(pullback, out, weights, checked) -> list:
    """jax.vjp's pullback of the weights (in the output's shape and dtype), per case input:
    its gradient where it is checked, else None."""
    got = iter(pullback(weights.reshape(out.shape).astype(out.dtype)))
    return [next(got) if ok else None for ok in checked]


def _view_kind(spec) -> str:
    if spec.permute:
        return "permuted"
    return " and ".join(k for k in ("slice", "expand") if getattr(spec, k)).replace(
        "slice", "sliced").replace("expand", "expanded")


def _persistent_cache() -> None:
    """jax's compiled functions kept on disk, in <cache>/jax (checkkit.cache), so that a
    second run does not compile them again; left alone when the user has chosen a cache
    directory for jax."""
    if jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    jax.config.update("jax_compilation_cache_dir", str(default_cache_dir() / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
