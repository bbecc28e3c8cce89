"""Op parameters: each op's declaration of them (`Params`), and the checks of parameters and
inputs shared by several op modules, written once.

Declarations. An op declares its parameters once, as data (OpDef.params, engine.registry):
a `Params` maps each name to a `Param` (its kind, its range with open or closed ends, its
default or REQUIRED, why the range is what it is) and holds the `Rule`s between them (rope:
freq_base != 1 under YaRN). make_node checks a node's parameters against it before the op's
infer, whether a user builds the op or a graph file is loaded (engine.graph_io), and a
composite op's builder checks its arguments against its own: an unknown, missing, malformed
or out-of-range parameter, or a broken rule, is a ParamError naming the op and the
parameter, and the kernels never see a value that divides by zero, leaves a function's
domain or overflows from the parameter alone. The constructors (`int_param`, `float_param`,
`factor_param`, `size_param`, `alibi_param`, `bool_param`, `choice_param`, `ints_param`,
`int_rows_param`, `pair_param`, `axes_param`) say the common kinds; the bounds they share
are INT32_MAX (ggml's int sizes), MAX_FACTOR / MIN_FACTOR (factors that multiply data, and
reciprocals the kernels take) and MAX_ALIBI_BIAS.

Checks. The checks of single parameters and of inputs that several op modules share
(`integer`, `pair`, `window_output_size`, `check_rows`, ...) are engine.param_checks; they
are re-exported here, where the ops import them with the declarations.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.errors import ParamError
from engine.param_checks import (
    INT64_MAX,
    INT64_MIN,
    boolean,
    check_float_dtype,
    check_float_input,
    check_rows,
    choice,
    int_rows,
    int_tuple,
    integer,
    ints,
    is_int,
    is_real,
    number,
    pair,
    shapes_str,
    show_value,
    window_output_size,
)

__all__ = [
    # the checks (engine.param_checks)
    "INT64_MAX", "INT64_MIN", "boolean", "check_float_dtype", "check_float_input",
    "check_rows", "choice", "int_rows", "int_tuple", "integer", "ints", "is_real", "number",
    "pair", "shapes_str", "show_value", "window_output_size",
    # the declarations
    "INT32_MAX", "MAX_ALIBI_BIAS", "MAX_FACTOR", "MIN_FACTOR", "PARAM_KINDS", "REQUIRED",
    "Param", "Params", "Rule", "alibi_param", "axes_param", "bool_param", "check_param",
    "choice_param", "factor_param", "float_param", "int_param", "int_rows_param",
    "ints_param", "pair_param", "size_param",
]

# --- declarations: every op's parameters as data ------------------------------------------------
#
# An op declares its parameters once (OpDef.params, engine.registry): per parameter a `Param`
# (its kind, its range with open or closed ends, whether it is required or its default, why
# the range is what it is), and the `Rule`s between them, together a `Params`. make_node
# checks a node's parameters against it (a user's call and a graph file being loaded alike),
# a composite op's builder checks its arguments against it, and the tests read it.

INT32_MAX = 2 ** 31 - 1     # ggml's int parameters (n_dims, n_past, window sizes, ...)
# The largest magnitude of a factor that multiplies data (a scale, a slope, attn_factor):
# the product of two of them and of an input of a few units stays far inside float32 (an
# attention block multiplies q and k by rope's attn_factor, then their product by the
# scores' scale), and so does the float32 log-sum-exp that attention's backward reads back
# (its rounding error, |lse| 2^-24, must stay far below exp's overflow at 709); models use
# factors within a few orders of 1. Its reciprocal is the smallest positive base or scale
# whose reciprocal a kernel takes (rope's 1/freq_scale, 1/freq_base per position).
MAX_FACTOR = 1e6
MIN_FACTOR = 1.0 / MAX_FACTOR
# ALiBi's slopes are >= 2^-max_bias: up to 1022 they are normal doubles, never 0, so that a
# slope times a mask's -inf stays -inf (0 * -inf would be NaN)
MAX_ALIBI_BIAS = 1022.0

PARAM_KINDS = ("int", "float", "bool", "choice", "ints", "int_rows", "pair", "axes", "check")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()     # the default of a parameter a node must be given


def _fmt_bound(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an op, declared.

    kind: "int"; "float" (a real number); "bool"; "choice" (one of `options`); "ints" (a
    tuple of ints, as a node stores a shape, an offset or axes); "int_rows" (a tuple of
    `width`-tuples of ints: pad's pairs, strided_slice's triples); "pair" (an int or a pair
    of ints, stored as the pair); "axes" (an int or a sequence of ints: a composite's axis
    argument); "check" (an opaque `check(op, name, value)` of an op outside the registry).
    low, high: the range of the value, or of each of its ints; None: no bound on that side
    (a float is then finite there). low_open, high_open: that end is excluded. A float range
    closed at -inf or inf takes that infinity (clamp's one-sided bounds); NaN never passes.
    default: REQUIRED, or the value a node gets when it is not given (make_node fills it in).
    nullable: None is a value too (attention's scale, None: 1/sqrt(D)).
    why: what the range keeps from the kernel (a division by zero, log of 0, ...).
    label: how messages name it (default: its name; the elementwise ops say "parameter x").
    """

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    options: tuple[str, ...] = ()
    width: int = 0
    default: Any = REQUIRED
    nullable: bool = False
    why: str = ""
    check_fn: Callable | None = None
    label: str = ""

    def __post_init__(self):
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"Param: kind must be one of {PARAM_KINDS}, got {self.kind!r}")
        if (self.kind == "check") != (self.check_fn is not None):
            raise ValueError("Param: kind 'check' and check_fn go together")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def contains(self, v) -> bool:
        """Whether the number v (one int of a sequence kind) lies in the range."""
        lo, hi = self.low, self.high
        if lo is not None and (v < lo or (self.low_open and v == lo)):
            return False
        if hi is not None and (v > hi or (self.high_open and v == hi)):
            return False
        return not (isinstance(v, float) and math.isinf(v) and v != lo and v != hi)

    def _form(self, op: str, name: str, value):
        kind = self.kind
        if kind == "int":   # int64, or as far as the range goes (dropout's uint64 seed)
            return integer(op, name, value, INT64_MIN, max(INT64_MAX, self.high or 0))
        if kind == "float":
            return number(op, name, value, finite=False)
        if kind == "bool":
            return boolean(op, name, value)
        if kind == "choice":
            return choice(*self.options)(op, name, value)
        if kind == "ints":
            return ints(op, name, value)
        if kind == "int_rows":
            return int_rows(self.width)(op, name, value)
        if kind == "pair":
            return pair(op, name, value)
        if kind == "axes":
            return integer(op, name, value) if is_int(value) else \
                int_tuple(op, name, value, None, None)
        return self.check_fn(op, name, value)

    def _numbers(self, value) -> tuple:
        """The numbers of a checked value that the range applies to."""
        if self.kind in ("int", "float"):
            return (value,)
        if self.kind in ("ints", "pair"):
            return tuple(value)
        if self.kind == "int_rows":
            return tuple(v for row in value for v in row)
        return ()

    def check(self, op: str, name: str, value):
        """`value` in canonical form (an int, a float, a tuple, ...), or ParamError naming
        the op, the parameter and the bound it breaks."""
        if value is None and self.nullable:
            return None
        name = self.label or name
        out = self._form(op, name, value)
        for v in self._numbers(out):
            if not self.contains(v):
                shown = show_value([list(r) for r in out] if self.kind == "int_rows" else
                                   list(out) if isinstance(out, tuple) else out)
                why = f" ({self.why})" if self.why else ""
                raise ParamError(f"{op}: {name} must be {self._broken(v)}, got {shown}{why}")
        return out

    def _broken(self, v) -> str:
        """The bound v breaks, in words ("positive", ">= 0", "at most 1022", "finite")."""
        lo, hi = self.low, self.high
        integral = self.kind != "float"
        if lo is not None and (v < lo or (self.low_open and v == lo)):
            if integral and lo in (0, 1) and not self.low_open:
                return "positive" if lo == 1 else "non-negative"
            if lo == 0 and self.low_open:
                return "positive"
            return f"{'>' if self.low_open else '>='} {_fmt_bound(lo)}"
        if hi is not None and (v > hi or (self.high_open and v == hi)):
            return f"{'below' if self.high_open else 'at most'} {_fmt_bound(hi)}"
        return "finite"

    def describe(self) -> str:
        """The declaration in words: 'int in [2, 2147483647]', 'number in (0, 1e+30], default
        10000', 'bool, default False', ..."""
        kind = {"int": "int", "float": "number", "bool": "bool", "ints": "tuple of ints",
                "int_rows": f"tuple of {self.width}-tuples of ints",
                "pair": "int or pair of ints", "axes": "int or sequence of ints",
                "check": f"checked by {getattr(self.check_fn, '__name__', 'a function')}",
                "choice": f"one of {list(self.options)}"}[self.kind]
        lo = "-inf" if self.low is None else _fmt_bound(self.low)
        hi = "inf" if self.high is None else _fmt_bound(self.high)
        if self.low is not None or self.high is not None:
            open_lo = self.low_open or self.low is None
            open_hi = self.high_open or self.high is None
            kind += f" in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}"
        elif self.kind == "float":
            kind = "finite number"
        if self.nullable:
            kind += " or None"
        return kind + (", required" if self.required else f", default {self.default!r}")


def int_param(low=None, high=None, *, default=REQUIRED, why="") -> Param:
    """An int in [low, high] (None: no bound; int64 in any case)."""
    return Param("int", low, high, default=default, why=why)


def float_param(low=None, high=None, *, low_open=False, high_open=False, default=REQUIRED,
                nullable=False, why="") -> Param:
    """A real number in the range (module doc of Param: finite unless closed at an
    infinity)."""
    return Param("float", low, high, low_open, high_open, default=default, nullable=nullable,
                 why=why)


def factor_param(*, default=REQUIRED, nullable=False, why="") -> Param:
    """A factor that multiplies data: a number in [-MAX_FACTOR, MAX_FACTOR]."""
    return float_param(-MAX_FACTOR, MAX_FACTOR, default=default, nullable=nullable, why=why)


def bool_param(*, default=REQUIRED) -> Param:
    return Param("bool", default=default)


def choice_param(*options: str, default=REQUIRED) -> Param:
    return Param("choice", options=tuple(options), default=default)


def ints_param(low=None, high=None, *, default=REQUIRED, why="") -> Param:
    """A tuple of ints (any number of them), each in [low, high]."""
    return Param("ints", low, high, default=default, why=why)


def int_rows_param(width: int, low=None, high=None, *, default=REQUIRED, why="") -> Param:
    """A tuple of `width`-tuples of ints, each in [low, high]."""
    return Param("int_rows", low, high, width=width, default=default, why=why)


def pair_param(low=None, high=None, *, default=REQUIRED, why="") -> Param:
    """An int or a pair of ints (stored as the pair), each in [low, high]."""
    return Param("pair", low, high, default=default, why=why)


def size_param(low: int = 1, *, pair: bool = False, default=REQUIRED, nullable=False,
               why="") -> Param:
    """A window's size, stride or dilation (low 1) or padding (low 0): an int in
    [low, INT32_MAX] (ggml's int), or with `pair` an int or a pair of them, one per axis
    (rows, cols). The kernels' index arithmetic (position * stride - padding + offset *
    dilation) stays far inside int64."""
    return Param("pair" if pair else "int", low, INT32_MAX, default=default,
                 nullable=nullable, why=why)


def alibi_param() -> Param:
    """ALiBi's max_bias (softmax, attention): 0 (none, the default) to MAX_ALIBI_BIAS."""
    return float_param(0.0, MAX_ALIBI_BIAS, default=0.0,
                       why="0: no ALiBi; a slope >= 2^-max_bias never rounds to 0, which "
                           "times a mask's -inf would be NaN")


def axes_param(*, default=None) -> Param:
    """None (every axis), an int or a sequence of ints: which axes the op reduces."""
    return Param("axes", default=default, nullable=True)


def check_param(check: Callable[[str, str, Any], Any], *, default=REQUIRED) -> Param:
    """A parameter checked by `check(op, name, value)` alone (an op outside the registry
    written before declarations; the registry's ops declare kinds and ranges)."""
    return Param("check", default=default, check_fn=check)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A rule between parameters: `holds(**values)`, given the checked (and defaulted)
    values of `names`, is True where they make sense together; `says` what it requires."""

    names: tuple[str, ...]
    holds: Callable[..., bool]
    says: str
    explain: Callable[[str, dict], str] | None = None   # (op, values) -> the message

    def check(self, op: str, values: dict) -> None:
        given = {n: values[n] for n in self.names}
        if not self.holds(**given):
            if self.explain is not None:
                raise ParamError(self.explain(op, given))
            got = ", ".join(f"{n}={show_value(v)}" for n, v in given.items())
            raise ParamError(f"{op}: {self.says}, got {got}")


class Params(Mapping):
    """An op's parameters, declared: name -> Param (in the order the op lists them), and
    the Rules between them. `check` is what make_node runs on a node's parameters."""

    def __init__(self, params: dict[str, Param] | None = None, rules: Sequence[Rule] = ()):
        self._params = dict(params or {})
        self.rules = tuple(rules)
        for name, p in self._params.items():
            if not isinstance(p, Param):
                raise TypeError(f"parameter {name!r}: expected a Param, got {p!r}")
        for rule in self.rules:
            if not set(rule.names) <= set(self._params):
                raise ValueError(f"rule {rule.says!r} names parameters that are not declared: "
                                 f"{sorted(set(rule.names) - set(self._params))}")

    def __getitem__(self, name: str) -> Param:
        return self._params[name]

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __repr__(self) -> str:
        return f"Params({', '.join(f'{k}: {p.describe()}' for k, p in self.items())})"

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(k for k, p in self.items() if p.required)

    def check(self, op: str, given: dict) -> dict:
        """Every declared parameter, checked and in canonical form, the defaults filled in
        (declaration order); ParamError naming the op and the parameter for one unknown,
        missing, malformed or out of range, or for a broken rule."""
        unknown = [k for k in given if k not in self._params]
        if unknown:
            raise ParamError(f"{op}: takes parameters {list(self._params)}, got unknown "
                             f"parameter {show_value(unknown[0])}")
        missing = [k for k in self.required if k not in given]
        if missing:
            raise ParamError(f"{op}: takes parameters {list(self._params)}, missing required "
                             f"parameter {missing[0]!r}")
        out = {k: p.check(op, k, given[k]) if k in given else p.default
               for k, p in self.items()}
        for rule in self.rules:
            rule.check(op, out)
        return out
