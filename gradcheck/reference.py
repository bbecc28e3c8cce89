"""The two references an engine is judged against: the float64 reference and the torch one.

The float64 reference is the case's own definition f, evaluated in float64 on the case's
(rounded) inputs. Its output f(x) is what the engine's forward output is checked against;
its loss, loss(x) = sum(f(x) * weights), is what finite differences differentiate into the
numerical gradients (gradcheck.numeric) that backprop is checked against. What f is depends
on the case, never on the engine under test:

- a registry case, or a function built from engine ops: our engine's float64 graph of it
  (the op's definition), whatever engine is checked (EngineReference);
- a user's numpy or torch function: its reference forward, `case.reference_forward` (the
  `reference=` argument of gradcheck.api.check_numpy and check_torch, by default the
  function itself), called on float64 numpy arrays (FunctionReference).

The torch reference is the third opinion: torch autograd on the op's torch equivalent, in
float64 (`torch_reference`). torch is optional: without it, or for a case without a torch
equivalent, the torch reference is absent and the case is judged on the float64 reference
alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

import numpy as np

import engine
from engine.backends.cpu import paths
from engine.mutation import patches
from engine.tensor import is_float
from gradcheck.adapters.engine_adapter import EngineAdapter, weighted_graph
from gradcheck.adapters.torch_adapter import as_torch
from gradcheck.numeric import compare


def constant_cells(f64_out) -> np.ndarray | None:
    """The output's constant cells: where the float64 reference's output is -inf or +inf
    (diag_mask_inf's masked scores are -inf by definition), as a bool mask; None where
    there are none. Such a cell is a constant of the op, not a value to differentiate: its
    loss weight is 0 (so sum(f(x) * weights) stays finite), the loss holds it to its value
    (Float64Reference.hold_constant: a perturbation that changes it makes the loss NaN, a
    failure), every engine must give the same infinity there (`settled`), and the row
    counts it as `constant`, never as a pass. Any other NaN or Inf stays a failure: an
    infinity where the reference is finite, or a NaN anywhere, is no constant."""
    mask = np.isinf(np.asarray(f64_out, np.float64))
    return mask if mask.any() else None


def settled(a, f64_out, constant) -> np.ndarray:
    """Output `a` (an engine's or torch's) for comparison: 0 at the constant cells where it
    holds the reference's infinity, NaN (a failure) at those where it does not."""
    a = np.asarray(a, np.float64)
    if constant is None:
        return a
    return np.where(constant, np.where(a == f64_out, 0.0, np.nan), a)


def forward_comparison(out, f64_out, constant, precision: str):
    """The engine's output against the float64 reference's: a Comparison for a float
    output (its constant cells settled), whether the two are equal for an integer one
    (see gradcheck.verdict)."""
    if not is_float(np.asarray(out).dtype):
        return bool(np.array_equal(out, f64_out))
    if constant is None:
        return compare(out, f64_out, precision)
    return compare(settled(out, f64_out, constant), settled(f64_out, f64_out, constant),
                   precision)


class Float64Reference:
    """The float64 reference of a case: its f in float64. `leaves`: per case input, the
    float64 array (in the leaf layout, see InputSpec.permute) that `loss` reads and
    numerical differentiation moves, or None for an input that is not checked. Call
    `set_weights` before `loss`; `hold_constant` where the output has constant cells."""

    output_shape: tuple[int, ...]
    leaves: list[np.ndarray | None]
    constant: np.ndarray | None = None

    def hold_constant(self, constant) -> None:
        """Leave the output's `constant` cells (constant_cells) out of the loss, which is
        NaN from now on at any point where one of them differs from its value here."""
        self.constant = constant
        self._held = self.output()[constant]

    def _held_loss(self, out) -> float:
        """sum(f(x) * weights) over the cells not constant; NaN if a constant one moved."""
        if not np.array_equal(out[self.constant], self._held):
            return float("nan")
        return float(np.sum(np.where(self.constant, 0.0, out) * self.weights))

    def set_weights(self, weights: np.ndarray) -> None:
        raise NotImplementedError

    def weigh(self, weights: np.ndarray):
        """Set the loss `weights`, the output's constant cells (constant_cells) weighted 0 and
        held (hold_constant): (the weights as set, the output, its constant cells or None)."""
        self.set_weights(weights)
        out = self.output()
        constant = constant_cells(out)
        if constant is not None:
            weights = np.where(constant, 0.0, weights)
            self.hold_constant(constant)
            self.set_weights(weights)
        return weights, out, constant

    def loss(self) -> float:
        """sum(f(x) * weights) at the current values of `leaves`."""
        raise NotImplementedError

    def held(self):
        """A context for many loss() calls in a row (numerical differences); see
        EngineReference's."""
        return contextlib.nullcontext()

    def output(self) -> np.ndarray:
        """f(x) in float64 at the current values of `leaves`."""
        raise NotImplementedError

    def magnitude(self) -> float:
        """sum |f(x) * weights|: the size of the terms the loss sums, which bounds its
        rounding (a loss of huge outputs weighted to cancel is small and rounds as they
        do; gradcheck.numeric)."""
        out = self.output()
        if self.constant is not None:
            out = np.where(self.constant, 0.0, out)
        return float(np.sum(np.abs(out * self.weights)))


class EngineReference(Float64Reference):
    """Our engine's graph of the case with every float dtype promoted to float64, on CPU."""

    def __init__(self, case, arrays):
        leaves, self._out, self._w, self._loss = weighted_graph(case.promoted("f64"), arrays,
                                                                as_params=False)
        if self._loss is None:
            raise TypeError(f"{case}: the output is {self._out.dtype}, not a float: "
                            "no gradient to check")
        self._graph = engine.Graph([self._loss], name=f"{case}.numeric")
        self._run = self._loss_flat = None
        self.output_shape = tuple(self._out.shape)
        self.leaves = [t.buffer() if spec.grad and is_float(t.dtype) else None
                       for spec, t in zip(case.inputs, leaves, strict=True)]

    def set_weights(self, weights):
        self.weights = np.asarray(weights, np.float64)
        self._w.set(self.weights)

    def loss(self) -> float:
        if self._run is None:
            self._plan()
        else:
            self._run()
        if self.constant is not None:
            return self._held_loss(self._out.buffer())
        return float(self._loss_flat[0])

    def held(self):
        """The plan's running context entered once for the block's runs instead of once a
        run (engine.executor.Executor.held)."""
        if self._run is None:
            self._plan()
        return self._graph.plan.executor.held()

    def output(self) -> np.ndarray:
        if self._run is None:
            self._plan()
        else:                     # planned: the executor alone, as loss() runs it
            self._run()
        return np.array(self._out.numpy())

    def _plan(self) -> None:
        """Plan and run the graph once; numerical differentiation then runs its executor
        directly (thousands of times a case), without Graph.compute's staleness check:
        this graph is private and never changes after it is built."""
        self._graph.compute("cpu")
        self._run = self._graph.plan.executor.run
        self._loss_flat = self._loss.buffer().reshape(-1)


class FunctionReference(Float64Reference):
    """A user's reference forward (numpy arrays in, array out) called on float64 copies of
    the inputs (integer inputs as they are)."""

    def __init__(self, case, arrays, forward):
        self._forward = forward
        self._specs = case.inputs
        self._values = [np.array(a, np.float64) if is_float(a.dtype) else np.asarray(a)
                        for a in case.leaf_arrays(arrays)]
        self.leaves = [v if spec.grad and is_float(v.dtype) else None
                       for spec, v in zip(case.inputs, self._values, strict=True)]
        self.output_shape = self.output().shape
        self.weights = None

    def set_weights(self, weights):
        self.weights = np.asarray(weights, np.float64)

    def output(self) -> np.ndarray:
        out = np.asarray(self._forward(*(spec.from_leaf(v) for spec, v
                                         in zip(self._specs, self._values, strict=True))))
        if not is_float(out.dtype):
            raise TypeError(f"the reference forward returned {out.dtype}, not a float: no "
                            "gradient to check")
        return out.astype(np.float64)

    def loss(self) -> float:
        if self.constant is not None:
            return self._held_loss(self.output())
        return float(np.sum(self.output() * self.weights))


def plain_vjp(case, arrays, weights):
    """(output, gradients) of the case in float64, our engine in plain mode."""
    with paths.plain():
        vjp = EngineAdapter("cpu").vjp(case.promoted("f64"), arrays, weights)
    return np.asarray(vjp.output, np.float64), [
        None if g is None else np.asarray(g, np.float64) for g in vjp.grads]


def plain_forward(case, arrays) -> np.ndarray:
    """The case's output in float64, our engine in plain mode (no gradient asked: a case
    with nothing to differentiate runs too)."""
    with paths.plain():
        return np.asarray(EngineAdapter("cpu").forward(case.promoted("f64"), arrays),
                          np.float64)


_LAST: list = []       # [(key, EngineReference)]: the last case's (float64_reference)


def float64_reference(case, arrays) -> Float64Reference:
    """The float64 reference of `case` on input values `arrays` (see the module doc). The
    last case's engine graph is kept, planned, and handed out again for the same case on
    the same values (its weights and constant cells set afresh by `weigh`), while no patch
    of engine.mutation.patches has started or ended: a case's reverse-mode, forward-mode and
    second-order rows share it."""
    forward = getattr(case, "reference_forward", None)
    if forward is not None:
        return FunctionReference(case, arrays, forward)
    # a kernel patched or put back since (a mutant, a test's planted kernel) makes a new
    # graph: the kept one's kernels were bound when it was planned
    key = (repr(case), tuple(hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                             for a in arrays), patches.generation())
    if _LAST and _LAST[0][0] == key:
        reference = _LAST[0][1]
        reference.constant = None
        return reference
    reference = EngineReference(case, arrays)
    _LAST[:] = [(key, reference)]
    return reference


@dataclasses.dataclass
class TorchReference:
    """torch's output and input gradients for a case, in float64."""

    output: np.ndarray
    grads: list[np.ndarray | None]    # per input, in the layout the op sees
    dtype: str = "float64"            # torch's output dtype, as torch names it ("float16")


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def torch_threads(case):
    """torch held to one intra-op thread while it computes a reference of a case that is
    not of the scale tier (restored after). A fast-tier case is tiny, below the size at
    which torch splits a kernel (its grain, 32,768 elements), but with two threads every
    op still opens an OpenMP region whose second thread spins: on the shared 2-core
    machine (load 10) a float64 softmax forward and backward of 252 elements cost 2.6-4.8
    ms of CPU with torch's default 2 threads and 0.06 ms with one (a loop of 300 in one
    process, alternating), and torch was a quarter of a warm `gradcheck --random 60`'s
    CPU on six ops (cProfile). The bits are the same but for torch's float32 convolution
    (oneDNN chooses its blocking by the thread count): of that run's 1,078 rows, 6
    conv_2d rows' precision figures against torch f32 moved (ref_err 1.2e-6 to 1.7e-6,
    ...), no verdict; with one thread that reference is the same on every machine,
    whatever its cores. A scale case keeps torch's threads: it is big enough to split."""
    import torch
    before = torch.get_num_threads()
    if getattr(case, "tier", "fast") == "scale" or before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def torch_reference(case, arrays, weights, native: bool = False) -> TorchReference | None:
    """The torch reference: output and input gradients of sum(torch_fn(*inputs) *
    weights), all in float64; None without torch or a torch equivalent. `native`: torch
    computes in the case's own dtypes instead (a good implementation at the precision under
    test, what the scale tier holds a float32 result to); the results are still returned
    as float64 arrays.

    `case` gives `torch_fn` (None: no torch equivalent), `inputs` (specs with `grad`) and
    the float64 keyword arguments `torch_kwargs` (`kwargs` when native)."""
    fn = case.torch_fn
    if fn is None or not torch_available():
        return None
    with torch_threads(case):
        return _torch_reference(case, arrays, weights, native, fn)


def _torch_reference(case, arrays, weights, native, fn) -> TorchReference:
    import torch
    tens = []
    for spec, a in zip(case.inputs, arrays, strict=True):
        t = as_torch(a if native or not is_float(a.dtype) else np.asarray(a, np.float64))
        if spec.grad and is_float(a.dtype):
            t.requires_grad_(True)
        tens.append(t)
    # native: the case's own parameters (a user's function case has only torch_kwargs)
    out = fn(*tens, **(case.kwargs if native and hasattr(case, "kwargs")
                       else case.torch_kwargs))
    grads: list[np.ndarray | None] = [None] * len(tens)
    if out.dtype.is_floating_point and any(t.requires_grad for t in tens):
        w = torch.tensor(np.asarray(weights, np.float64).reshape(tuple(out.shape)))
        if native:
            (out * w.to(out.dtype)).sum().backward()
        else:
            (out.to(torch.float64) * w).sum().backward()
        # per element of the view the op sees; an expanded input's gradient is its leaf's
        # (engine.samples.InputSpec.view_gradient), as every engine's is compared
        grads = [spec.view_gradient(t.grad.double().numpy() if t.grad is not None
                                    else np.zeros(t.shape))
                 if t.requires_grad else None for spec, t in zip(case.inputs, tens,
                                                                  strict=True)]
    return TorchReference(out.detach().to(torch.float64).numpy()
                          if out.dtype.is_floating_point else out.detach().numpy(), grads,
                          str(out.dtype).removeprefix("torch."))
