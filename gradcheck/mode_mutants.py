"""The self-test's bugs of forward mode and second order: each must be caught by the new
checks (gradcheck.derivatives) and must NOT be caught by first-order reverse mode, or it
would prove nothing about them.

Each is a bug an engine writer makes in a rule that only the new modes run:

- our engine's second-order rules: the backward rules of dedicated backward ops (rope_back,
  repeat_back, get_rows_back), which only run when a backward graph is differentiated
  again (our forward mode and second order, gradcheck.adapters.engine_adapter);
- a torch.autograd.Function's `jvp` (forward-mode rule) with the wrong sign, or dropping
  one input's term;
- a torch.autograd.Function whose backward saves its output detached (double backward
  then drops the derivative of the saved output: the classic gradient-penalty bug);
- a jax.custom_jvp whose tangent rule stops the gradient of its derivative factor (first
  derivatives right, the second loses a term: jax-ml/jax#5054's kind).

And two controls, correct rules run the same way, which must not be flagged. A row passes
when its mutant is caught by the check it names and missed by reverse mode (a control:
when nothing flags it); `skip` when its engine is not installed (jax).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from engine.mutation.patches import backward_replaced, scaled_backward
from engine.registry import get_op
from reports import Result

TOOL = "gradcheck-selftest"


@dataclasses.dataclass(frozen=True)
class ModeMutant:
    """A bug in a rule only forward mode or second order runs. `run()` gives (the
    reverse-mode row, the row of the check that must catch it); `check` names that check
    ("fwd" or "order 2")."""

    name: str
    check: str
    description: str
    run: Callable[[], tuple[Result, Result]]
    control: bool = False


def _registry_case(op: str, dtype: str = "f64"):
    return next(s for s in get_op(op).samples() if s.dtype == dtype
                and not any(i.is_view for i in s.inputs)
                and s.cotangent == "contiguous")


def _ours(op: str, patched: str, factor: float, kind: str):
    """Our engine on op's first float64 case, `patched`'s backward rule scaled by `factor`
    (its second-order rule: it runs only when a backward graph is differentiated)."""
    def run():
        from gradcheck.check import check_case
        case = _registry_case(op)
        with backward_replaced(patched, lambda real: scaled_backward(real, factor)):
            rev, new = check_case(case, "both" if kind == "fwd" else "rev",
                                  2 if kind == "order 2" else 1)
        return rev, new
    return run


def _x():
    return np.random.default_rng(5).normal(size=(3, 4))


def _torch_tanh(jvp_sign: float = 1.0, detach: bool = False):
    """tanh as a new-style torch.autograd.Function (functorch-ready): backward right,
    its jvp multiplied by `jvp_sign`, its saved output detached where `detach`."""
    import torch

    class Tanh(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return torch.tanh(x)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(output.detach() if detach else output)
            ctx.save_for_forward(output)

        @staticmethod
        def backward(ctx, g):
            y, = ctx.saved_tensors
            return g * (1 - y * y)

        @staticmethod
        def jvp(ctx, t):
            y, = ctx.saved_tensors
            return jvp_sign * t * (1 - y * y)

    return Tanh.apply


def _torch_mul(drop_y_term: bool):
    """x * y as a torch Function whose jvp drops y's tangent term where asked."""
    import torch

    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(x, y):
            return x * y

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)
            ctx.save_for_forward(*inputs)

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y, g * x

        @staticmethod
        def jvp(ctx, tx, ty):
            x, y = ctx.saved_tensors
            return tx * y if drop_y_term else tx * y + x * ty

    return Mul.apply


def _torch(make, arrays, kind: str):
    def run():
        from gradcheck.api import check_torch
        fn = make()
        one = ("contiguous",)
        rev = check_torch(fn, arrays(), cotangents=one)
        new = (check_torch(fn, arrays(), cotangents=one, ad="fwd") if kind == "fwd" else
               check_torch(fn, arrays(), cotangents=one, ad="fwd", order=2))
        return rev, new
    return run


def _jax_tanh(stop_factor: bool):
    """tanh as a jax.custom_jvp whose tangent rule is t * (1 - tanh(x)^2), with that factor
    under stop_gradient where asked (its first derivatives stay right)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def tanh(x):
        return jnp.tanh(x)

    @tanh.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        y = jnp.tanh(x)
        factor = 1 - y * y
        return y, t * (jax.lax.stop_gradient(factor) if stop_factor else factor)

    return tanh


def _jax(stop_factor: bool):
    def run():
        from gradcheck.adapters.jax.adapter import JaxAdapter
        from gradcheck.check import check_case
        adapter = JaxAdapter(jit=False)
        adapter.ops = {**adapter.ops, "tanh": lambda x: _jax_tanh(stop_factor)(x)}
        rev, new = check_case(_registry_case("tanh"), "rev", 2, adapter=adapter)
        return rev, new
    return run


MODE_MUTANTS = (
    ModeMutant("control_second_order_rules", "fwd",
               "our engine's second-order rules as they are (rope_back's backward scaled by "
               "1): nothing may be flagged", _ours("rope", "rope_back", 1.0, "fwd"),
               control=True),
    ModeMutant("rope_back_backward_sign", "fwd",
               "rope_back's backward rule (rope's second-order rule) with the wrong sign",
               _ours("rope", "rope_back", -1.0, "fwd")),
    ModeMutant("repeat_back_backward_doubled", "fwd",
               "repeat_back's backward rule (repeat's second-order rule) doubled",
               _ours("repeat", "repeat_back", 2.0, "fwd")),
    ModeMutant("get_rows_back_backward_halved", "fwd",
               "get_rows_back's backward rule (get_rows' second-order rule) halved",
               _ours("get_rows", "get_rows_back", 0.5, "fwd")),
    ModeMutant("control_torch_function", "order 2",
               "a correct tanh Function (forward-mode rule, saved output kept): nothing may "
               "be flagged", _torch(lambda: _torch_tanh(), lambda: [_x()], "order 2"),
               control=True),
    ModeMutant("torch_jvp_sign", "fwd",
               "a torch Function's jvp rule with the wrong sign (tanh)",
               _torch(lambda: _torch_tanh(jvp_sign=-1.0), lambda: [_x()], "fwd")),
    ModeMutant("torch_jvp_drops_term", "fwd",
               "a torch Function's jvp rule of x * y that drops y's term",
               _torch(lambda: _torch_mul(True), lambda: [_x(), _x() + 1], "fwd")),
    ModeMutant("torch_saved_output_detached", "order 2",
               "a torch Function whose backward saves its output detached: double backward "
               "drops a term (tanh)",
               _torch(lambda: _torch_tanh(detach=True), lambda: [_x()], "order 2")),
    ModeMutant("jax_custom_jvp_stopped_factor", "order 2",
               "a jax.custom_jvp whose tangent rule stops the gradient of its factor "
               "(tanh): first derivatives right, the second drops a term",
               _jax(True)),
)


def _missing_engine(mutant: ModeMutant) -> str | None:
    if mutant.name.startswith("jax"):
        try:
            import jax  # noqa: F401
        except ImportError:
            return "jax is not installed (pip install 'gradverify[jax]')"
    if "torch" in mutant.name:
        from gradcheck.reference import torch_available
        if not torch_available():
            return "torch is not installed"
    return None


def run_mode_mutant(mutant: ModeMutant) -> Result:
    """One self-test row (see the module doc)."""
    t0 = time.perf_counter()
    labels = {"kind": "control" if mutant.control else "mode", "tier": mutant.check}
    missing = _missing_engine(mutant)
    if missing:
        return Result(TOOL, mutant.name, "skip", message=missing, labels=labels)
    try:
        rev, new = mutant.run()
    except Exception as exc:   # the mutant itself broke: the self-test's fault, not a catch
        return Result(TOOL, mutant.name, "error", labels=labels,
                      message=f"mutant could not run: {type(exc).__name__}: {exc}")
    flagged = new.status in ("fail", "error")
    metrics = {"cases": 1, "caught": int(flagged), "caught_in": new.name,
               "check": mutant.check if flagged else "-", "reverse_mode": rev.status,
               "seconds": round(time.perf_counter() - t0, 2)}
    if mutant.control:
        ok = not flagged and rev.status == "pass" and new.status == "pass"
        return Result(TOOL, mutant.name, "pass" if ok else "fail", metrics,
                      "control: nothing flagged (as it must be)" if ok else
                      f"CONTROL FLAGGED: reverse mode {rev.status}, {mutant.check} "
                      f"{new.status}: {new.message[:200]}", labels)
    if rev.status != "pass":
        return Result(TOOL, mutant.name, "fail", metrics,
                      f"reverse mode catches it too ({rev.status}: {rev.message[:160]}): "
                      f"it does not test the {mutant.check} check", labels)
    if not flagged:
        return Result(TOOL, mutant.name, "fail", metrics,
                      f"SURVIVED the {mutant.check} check ({new.status}): "
                      f"{mutant.description}", labels)
    return Result(TOOL, mutant.name, "pass", metrics,
                  f"caught by {mutant.check}, missed by reverse mode: {new.message[:200]}",
                  labels)


def run_mode_mutants(mutants=MODE_MUTANTS) -> list[Result]:
    return [run_mode_mutant(m) for m in mutants]
