"""The mutants' registry (engine.mutation): every differentiable op has a mutant or a stated
reason, every mutant names registered ops, once, and sits beside the op it breaks.

"Has a mutant": the op is among a mutant's `ops` (its cases must catch the bug), or the
mutant's patch replaces the op's backward rule or one of its kernels
(engine.mutation.patched_ops: pool_2d_back, whose kernel the pool_2d mutants break). A
differentiable op is one with a backward rule, a composite, or a dedicated backward op
(kind "backward"). Each check returns its problems, one a line, so that it can be shown to
fail on a planted case (the tests at the end).
"""

from __future__ import annotations

import contextlib

import pytest

import engine.ops  # noqa: F401  (loads every op module: their mutants and exemptions register)
from engine import mutation
from engine.mutation.patches import scaled
from engine.registry import OpDef, all_ops, get_op, register, unregister
from gradcheck.mutants import CONTROL, MUTANTS

SHARED = "engine.mutation"      # where the mutants of no one op (the 16-bit machinery) sit


def op_module(op: OpDef) -> str:
    """The module that defines op `op`: that of its infer rule (its compose function for a
    composite), which every op module defines itself."""
    return (op.compose if op.kind == "composite" else op.infer).__module__


def differentiable(op: OpDef) -> bool:
    return op.differentiable or op.kind == "backward"


def covered() -> dict[str, set[str]]:
    """op -> the names of the mutants that cover it (module doc)."""
    out: dict[str, set[str]] = {}
    for m in mutation.mutants():
        for op in set(m.ops) | mutation.patched_ops(m):
            out.setdefault(op, set()).add(m.name)
    return out


def coverage_problems() -> list[str]:
    """Differentiable ops with neither a mutant nor a stated reason; and exemptions that are
    stale (an op unknown, not differentiable, or with a mutant now) or stated away from the
    op's module."""
    ops, cover, exempt = all_ops(), covered(), mutation.exemptions()
    problems = [f"{name}: differentiable, but no mutant covers it and no reason is stated "
                f"(mutation.exempt({name!r}, ...) in {op_module(op)})"
                for name, op in ops.items()
                if differentiable(op) and name not in cover and name not in exempt]
    for name in exempt:
        if name not in ops:
            problems.append(f"{name}: exempted, but no such op is registered")
            continue
        if not differentiable(ops[name]):
            problems.append(f"{name}: exempted, but it has no gradient to mutate")
        if name in cover:
            problems.append(f"{name}: exempted, but mutants cover it: {sorted(cover[name])}")
        if mutation.exempted_in(name) != op_module(ops[name]):
            problems.append(f"{name}: exempted in {mutation.exempted_in(name)}, not in its "
                            f"module {op_module(ops[name])}")
    return problems


def mutant_problems(mutants=None) -> list[str]:
    """Mutants naming an unregistered op, names used twice (the control's too), and mutants
    declared away from the module of every op they name or patch (a mutant patching no op,
    the 16-bit machinery's, belongs in engine.mutation)."""
    mutants = mutation.mutants() if mutants is None else mutants
    ops, problems, seen = all_ops(), [], {CONTROL.name}
    for m in mutants:
        if m.name in seen:
            problems.append(f"{m.name}: the name is used twice")
        seen.add(m.name)
        unknown = [op for op in m.ops if op not in ops]
        if unknown or not m.ops:
            problems.append(f"{m.name}: names ops {list(m.ops)}, unregistered: {unknown}")
            continue
        if not any(r is m for r in mutation.mutants()):
            continue                            # not registered: declared nowhere
        named = {op_module(ops[op]) for op in (*m.ops, *mutation.patched_ops(m))}
        home = mutation.declared_in(m.name)
        if home not in named and not (home.startswith(SHARED + ".") or home == SHARED):
            problems.append(f"{m.name}: declared in {home}, not in a module of its ops or of "
                            f"the ops it patches ({sorted(named)})")
        if home.split(".")[:2] == SHARED.split(".") and mutation.patched_ops(m):
            problems.append(f"{m.name}: declared in {home}, but it breaks "
                            f"{sorted(mutation.patched_ops(m))}: it belongs beside that op")
    return problems


# --- the registry as it is ------------------------------------------------------------------
def test_every_differentiable_op_has_a_mutant_or_a_stated_reason():
    problems = coverage_problems()
    assert not problems, "\n".join(problems)


def test_every_mutant_names_registered_ops_once_and_sits_beside_them():
    problems = mutant_problems()
    assert not problems, "\n".join(problems)


def test_every_registered_mutant_is_in_gradchecks_table_in_the_registrys_order():
    assert list(MUTANTS) == [m.name for m in mutation.mutants()]
    assert all(MUTANTS[m.name] is m for m in mutation.mutants())
    assert len(MUTANTS) == 59


def test_the_listing_is_stable_by_module_then_declaration():
    homes = [mutation.declared_in(m.name) for m in mutation.mutants()]
    assert homes == sorted(homes)
    assert mutation.mutants() == mutation.mutants()


def test_every_reason_is_said():
    assert all(reason.strip() for reason in mutation.exemptions().values())
    with pytest.raises(ValueError, match="needs a reason"):
        mutation.exempt("relu", " ")


def test_patched_ops_finds_the_op_a_mutant_breaks_and_restores_it():
    kernels = get_op("pool_2d_back").kernels
    assert mutation.patched_ops(MUTANTS["pool_max_grad_to_neighbour"]) == {"pool_2d_back"}
    assert mutation.patched_ops(MUTANTS["store_truncates"]) == set()     # the 16-bit machinery
    assert get_op("pool_2d_back").kernels is kernels


# --- the checks fail on planted cases -------------------------------------------------------
@contextlib.contextmanager
def planted_op(name: str):
    """A differentiable toy op `name` (x -> x), registered from this module, for the block."""
    register(OpDef(name, infer=lambda x: (x.shape, x.dtype), backward=lambda g, out, x: (g,)))
    try:
        yield
    finally:
        unregister(name)


@contextlib.contextmanager
def planted_mutant(m: mutation.Mutant, module: str | None = None):
    mutation.register(m, module=module or __name__)
    try:
        yield
    finally:
        mutation.unregister(m.name)


def test_a_differentiable_op_without_a_mutant_or_a_reason_fails():
    with planted_op("toy_twice"):
        problems = coverage_problems()
        assert any(p.startswith("toy_twice: differentiable") for p in problems), problems
        mutation.exempt("toy_twice", "a toy", module=__name__)
        try:
            # stated in the op's module (this one, which holds its infer): fine
            assert not any(p.startswith("toy_twice") for p in coverage_problems())
        finally:
            mutation.unexempt("toy_twice")
        mutation.exempt("toy_twice", "a toy", module="engine.ops.unary")
        try:
            assert any("toy_twice: exempted in engine.ops.unary" in p
                       for p in coverage_problems())
        finally:
            mutation.unexempt("toy_twice")
    assert not coverage_problems()


def test_a_stale_exemption_fails():
    mutation.exempt("relu", "no mutant yet", module="engine.ops.unary")
    try:
        assert any(p.startswith("relu: exempted, but mutants cover it")
                   for p in coverage_problems())
    finally:
        mutation.unexempt("relu")
    mutation.exempt("no_such_op", "gone", module="engine.ops.unary")
    try:
        assert "no_such_op: exempted, but no such op is registered" in coverage_problems()
    finally:
        mutation.unexempt("no_such_op")


def test_a_mutant_of_an_unknown_op_fails():
    ghost = mutation.Mutant("ghost_grad_scaled", ("no_such_op",), "a ghost", scaled("relu", 2.0))
    with planted_mutant(ghost, module="engine.ops.unary"):
        assert any(p.startswith("ghost_grad_scaled: names ops") for p in mutant_problems())
    assert not mutant_problems()


def test_a_name_used_twice_fails():
    twin = mutation.Mutant("relu_grad_scaled", ("relu",), "again", scaled("relu", 2.0))
    with pytest.raises(ValueError, match="registered twice"):
        mutation.register(twin)
    assert any("used twice" in p for p in mutant_problems([*mutation.mutants(), twin]))
    control_twin = mutation.Mutant(CONTROL.name, ("relu",), "again", scaled("relu", 2.0))
    assert any("used twice" in p for p in mutant_problems([control_twin]))


@pytest.mark.parametrize("module", ["engine.ops.reduce", "engine.mutation"])
def test_a_mutant_away_from_its_op_fails(module):
    """A relu mutant declared in reduce's module (not relu's), or in the shared package
    though it breaks relu's rule."""
    stray = mutation.Mutant("relu_grad_halved", ("relu",), "relu's gradient halved",
                            scaled("relu", 0.5))
    with planted_mutant(stray, module=module):
        problems = mutant_problems()
    assert any(p.startswith(f"relu_grad_halved: declared in {module}") for p in problems), \
        problems
    with planted_mutant(stray, module="engine.ops.unary"):      # beside relu: fine
        assert not mutant_problems()
