"""The verdict on one case, from its comparisons alone: pure functions, no arrays, no engine.

A case's comparisons (gradcheck.numeric.Comparison records, made by gradcheck.check) are:

- forward: the engine's output against the float64 reference's output;
- per checked gradient (an input's in full mode, the random projections' in fast mode):
  backprop against the numerical gradient (b-n), backprop against the torch reference (b-t)
  and the numerical gradient against the torch reference (n-t), the last two only when
  torch ran;
- the engine's output against torch's (with torch, for a float output);
- determinism (two backprop runs, same bits) and, off the CPU, what differs from the same
  engine on the CPU (`vs_cpu`).

Three opinions name the side that is off (`arbitrate`):

    b-n  b-t  n-t
    ok   ok   ok    pass
    off  off  ok    backprop is off: numerical and torch agree
    off  ok   any   the numerical gradient is off: the float64 reference's forward does
                    not match the backward that the engine and torch share
    ok   any  off   torch is off: its forward differs, or the torch reference is wrong
    off  off  off   all three disagree
    ok   off  ok    all three disagree (b-n and n-t agree within their tolerances, b-t not)

Without torch, b-n alone decides. NaN or Inf in backprop fails whatever the rest says.
Kinks (non-differentiable points) are counted, never judged; a case where they are more
than KINK_DOMINATED of the judged points fails: its sample generator needs fixing.

Power: every comparison knows the smallest relative error of the whole array that it
would flag (gradcheck.numeric.Comparison.power); a gradient's power is the smaller of its
b-n and b-t comparisons', the output's that of the forward comparison (reported, not
judged: a tiny output's relative error is beyond any tolerance's floor, and its forward is
not what a gradient check is for). A row that passes but whose power is worse than
VACUOUS_BEYOND of its dtype for some input could not have seen an error of that size: it
is `vacuous`, not `pass`, and its message says which input and why (its reference is zero
everywhere, the cotangent lies in the VJP's null space, or the tolerance swallows it).
The precision verdict's own power (gradcheck.precision) counts where it is tighter. An op
whose derivative is 0 by definition (`zero_by_definition`) is no such case: its gradient
is checked to be exactly 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gradcheck.numeric import Comparison

KINK_DOMINATED = 0.5     # a case whose kinks exceed this share is itself a failure
# the largest power (relative error a row is sure to flag) a row may have and still pass:
# a row that could not see a 10% error (25% in 16 bits) checked nothing worth a PASS
VACUOUS_BEYOND = {"f64": 0.10, "f32": 0.10, "f16": 0.25, "bf16": 0.25}
ZERO_BEYOND = 1e3        # a power beyond this: the reference is 0 but for rounding
INTEGER_FORWARD_OFF = "forward: output differs from the float64 reference"


@dataclasses.dataclass(frozen=True)
class GradientOutcome:
    """The comparisons of one checked gradient, named `name` (an input, or "directions")."""

    name: str
    vs_numerical: Comparison                  # b-n: backprop against the numerical gradient
    finite: bool = True                       # backprop holds no NaN or Inf
    vs_torch: Comparison | None = None        # b-t (None: no torch reference)
    numerical_vs_torch: Comparison | None = None   # n-t (None: no torch reference)
    subject: str = ""                         # what is judged, in messages (default:
    #                                           "backprop of NAME"; "the JVP", ...)

    @property
    def power(self) -> float:
        """The smallest relative error of this gradient that its comparisons flag."""
        bt = self.vs_torch
        return min(self.vs_numerical.power, np.inf if bt is None else bt.power)


@dataclasses.dataclass(frozen=True)
class Arbitration:
    """One gradient's verdict: its problem (None: it passes) and whether torch is off."""

    problem: str | None
    torch_off: bool = False


def worst_element(name: str, vs_numerical: Comparison) -> str:
    """The worst element of a gradient against its numerical gradient, as the `worst`
    column shows it: 'x[0, 3]: num 0.506134, bp 0.506134'."""
    return (f"{name}{list(vs_numerical.worst_index or ())}: num "
            f"{vs_numerical.worst_expected:.6g}, bp {vs_numerical.worst_value:.6g}")


def arbitrate(g: GradientOutcome, worst: str) -> Arbitration:
    """Which side of one gradient is off (see the module doc's table); `worst`: the worst
    element so far, as worst_element gives it, quoted in the message."""
    bn, bt, nt = g.vs_numerical, g.vs_torch, g.numerical_vs_torch
    if bn.nonfinite or not g.finite:
        return Arbitration(f"NaN/Inf: {g.name} has {bn.nonfinite} non-finite values")
    if bt is None or nt is None:
        if bn.ok:
            return Arbitration(None)
        return Arbitration(f"numerical: {g.name} {bn.failures}/{bn.checked} off vs "
                           f"numerical, worst {worst}")
    if bn.ok and bt.ok and nt.ok:
        return Arbitration(None)
    if not bn.ok and not bt.ok and nt.ok:
        problem = (f"numerical: {g.subject or 'backprop of ' + g.name} is off "
                   f"({bn.failures}/{bn.checked} elements), numerical and torch agree, "
                   f"worst {worst}")
    elif not bn.ok and bt.ok:
        problem = (f"numerical: {g.name}: numerical gradient disagrees with backprop and "
                   "torch (the float64 reference's forward does not match the backward of "
                   "the engine and torch)")
    elif bn.ok and not nt.ok:
        problem = (f"torch: {g.name}: torch disagrees with backprop and numerical "
                   f"({nt.failures}/{nt.checked} elements; forward differs from torch's, "
                   "or the torch reference is wrong)")
    else:
        problem = f"numerical: {g.name}: backprop, numerical and torch all disagree"
    return Arbitration(problem, torch_off=True)


def forward_problem(forward: Comparison | bool) -> str | None:
    """The engine's output against the float64 reference's: a Comparison for a float
    output, for an integer output whether the two are equal. None when they agree."""
    if isinstance(forward, bool):
        return None if forward else INTEGER_FORWARD_OFF
    if forward.ok:
        return None
    what = "has NaN/Inf" if forward.nonfinite else "differs from the float64 reference"
    return (f"forward: output {what} ({forward.failures}/{forward.checked} elements, max "
            f"abs err {forward.max_abs:.3g}, worst {list(forward.worst_index or ())}: "
            f"reference {forward.worst_expected:.6g}, engine {forward.worst_value:.6g})")


def torch_forward_problem(forward_vs_torch: Comparison | None) -> str | None:
    """The engine's output against torch's (None: not compared, or they agree)."""
    if forward_vs_torch is None or forward_vs_torch.ok:
        return None
    return (f"torch: forward output differs from torch's ({forward_vs_torch.failures}/"
            f"{forward_vs_torch.checked} elements, max abs err "
            f"{forward_vs_torch.max_abs:.3g})")


def kink_problem(checked: int, kinks: int) -> str | None:
    """A failure when kinks are more than KINK_DOMINATED of the judged points."""
    judged = checked + kinks
    if judged and kinks > KINK_DOMINATED * judged:
        return (f"kinks: {kinks} of {judged} checked points are kinks "
                "(non-differentiable); the sample generator needs fixing")
    return None


def cpu_problem(backend: str, differences) -> str | None:
    """`backend` against the same engine on the CPU: `differences` names what is off."""
    if not differences:
        return None
    return f"backend: {backend} differs from cpu: {', '.join(differences)}"


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """Everything one case's verdict is made of (see the module doc)."""

    forward: Comparison | bool               # vs the float64 reference (bool: integer output)
    gradients: tuple[GradientOutcome, ...]
    torch_ran: bool = False                  # a torch reference was computed
    forward_vs_torch: Comparison | None = None
    differs: bool = False                    # two backprop runs gave different bits
    backend: str = "cpu"
    vs_cpu: tuple[str, ...] | None = None    # None: not compared; else what differs
    declined: str = ""                       # "input: why; ..." of the declined inputs
    precision: Any = None                    # gradcheck.precision.Verdict (None: not judged)
    others: tuple[str, ...] = ()             # problems of checks beside these comparisons
    #                                          (forward mode's adjoint identity)
    notes: tuple[str, ...] = ()              # what the row says without failing for it
    dtype: str = ""                          # the precision judged in ("": power not judged)
    powers: dict | None = None               # per checked input, its power (None: each
    #                                          gradient's, by name; fast mode splits them)
    cotangent: str = "contiguous"            # the case's cotangent layout (see vacuity)
    zero_by_definition: str = ""             # why the op's derivative is 0 everywhere


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A case's status, the problems that make it fail, notes that do not (declined
    inputs) and the numbers its row shows."""

    status: str
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    checked: int
    kinks: int
    max_abs: float
    max_rel: float
    worst: str
    forward: str                              # "agree" or "off"
    torch: str                                # "agree", "off" or "n/a"
    vs_cpu: str | None                        # "agree", "off" or None (not compared)
    precision: dict = dataclasses.field(default_factory=dict)   # its metrics, if judged
    power: dict = dataclasses.field(default_factory=dict)       # input name -> power
    power_output: float | None = None                           # the forward's power

    @property
    def message(self) -> str:
        return "; ".join(self.problems + self.notes)

    def metrics(self, checked_fraction: float) -> dict:
        """The row's metrics of a judged case (`checked_fraction`: its mode's, see
        gradcheck.modes), vs_cpu only where it was compared."""
        metrics = {"checked": self.checked, "checked_fraction": checked_fraction,
                   "kinks": self.kinks, "max_abs_err": self.max_abs,
                   "max_rel_err": self.max_rel, "worst": self.worst, "forward": self.forward,
                   "torch": self.torch}
        if self.vs_cpu is not None:
            metrics["vs_cpu"] = self.vs_cpu
        return metrics | power_metrics(self.power, self.power_output) | self.precision


def power_metrics(power: dict, output: float | None = None) -> dict:
    """A row's power metrics: `power`, the worst (largest) over its inputs, and `power_of`,
    whose it is; `power_output`, the forward output's (where compared)."""
    metrics = {}
    if power:
        name = max(power, key=lambda k: power[k])
        metrics = {"power": float(power[name]), "power_of": name}
    if output is not None:
        metrics["power_output"] = float(output)
    return metrics


def vacuity(power: dict, dtype: str, cotangent: str = "contiguous") -> str | None:
    """Why a row with these powers (name -> power) is vacuous in `dtype`, or None when every
    one is within VACUOUS_BEYOND (or dtype is not judged)."""
    bound = VACUOUS_BEYOND.get(dtype)
    if bound is None:
        return None
    reasons = []
    for name, p in power.items():
        if p <= bound:
            continue
        if p >= ZERO_BEYOND:
            why = "its reference gradient is 0 everywhere" + (
                "" if not np.isfinite(p) else " (but for rounding)")
            if cotangent != "contiguous":
                why += (f" (cotangent={cotangent}: the upstream gradient may lie in the "
                        "VJP's null space)")
        else:
            why = (f"the tolerance lets a {p:.3g}x relative error pass (the reference is "
                   "small against the tolerance's floor)") if p >= 1 else (
                   f"the tolerance lets a {p:.0%} error pass (the reference is small "
                   "against the tolerance's floor)")
        reasons.append(f"{name}: {why}")
    if not reasons:
        return None
    return (f"vacuous: this row could not see a {bound:.0%} error in {dtype}: "
            + "; ".join(reasons))


def judge(o: Outcomes) -> Verdict:
    """The verdict on one case: "fail" when any comparison names a problem, else
    "vacuous" when its power is too weak (see the module doc) in `o.dtype`, else "pass".
    The message lists the problems in this order: forward, each gradient, torch's forward,
    the other checks' (`others`), precision, kinks, determinism, vs_cpu; then the declined
    inputs and the notes."""
    problems = []
    forward = forward_problem(o.forward)
    if forward:
        problems.append(forward)
    checked = kinks = 0
    max_abs = max_rel = 0.0
    worst = ""
    torch_off = False
    for g in o.gradients:
        bn = g.vs_numerical
        checked += bn.checked
        kinks += bn.kinks
        if bn.max_abs >= max_abs:
            max_abs, max_rel = bn.max_abs, max(max_rel, bn.max_rel)
            worst = worst_element(g.name, bn)
        max_rel = max(max_rel, bn.max_rel)
        verdict = arbitrate(g, worst)
        torch_off |= verdict.torch_off
        if verdict.problem:
            problems.append(verdict.problem)
    torch_forward = torch_forward_problem(o.forward_vs_torch)
    if torch_forward:
        problems.append(torch_forward)
        torch_off = True
    problems += o.others
    for problem in (None if o.precision is None else o.precision.problem,
                    kink_problem(checked, kinks),
                    "determinism: two backward runs gave different bits" if o.differs
                    else None,
                    None if o.vs_cpu is None else cpu_problem(o.backend, o.vs_cpu)):
        if problem:
            problems.append(problem)
    vs_cpu = None if o.vs_cpu is None else "off" if o.vs_cpu else "agree"
    power = dict(o.powers) if o.powers is not None else {}
    if o.powers is None:
        for g in o.gradients:
            power[g.name] = min(power.get(g.name, np.inf), g.power)
    held = getattr(o.precision, "powers", None) or {}
    for name, p in held.items():      # the precision rule flags what the tolerance misses
        if name in power:
            power[name] = min(power[name], p)
    output = None
    if isinstance(o.forward, Comparison):
        output = min(o.forward.power, held.get("output", np.inf))
    notes = o.notes
    status = "fail" if problems else "pass"
    if o.zero_by_definition:
        power = {}
        notes += (f"zero by definition: {o.zero_by_definition}",)
    vacuous = vacuity(power, o.dtype, o.cotangent)
    if not problems and vacuous:
        status = "vacuous"
    return Verdict(status, tuple(problems) + ((vacuous,) if status == "vacuous" else ()),
                   ((f"declined (not checked): {o.declined}",) if o.declined else ()) +
                   notes,
                   checked, kinks, max_abs, max_rel, worst, "off" if forward else "agree",
                   "n/a" if not o.torch_ran else "off" if torch_off else "agree", vs_cpu,
                   {} if o.precision is None else o.precision.metrics(), power, output)
