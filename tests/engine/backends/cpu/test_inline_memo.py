"""numba's inlining with each inlined function translated once (engine.backends.cpu.
inline_memo): the same machine code as numba's own inlining, a function translated once
however many call sites inline it, and a fresh translation where a value the IR froze has
changed (a global rebound, in the function itself or in one it inlines)."""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest

from engine.backends.cpu import inline_memo, jit  # noqa: F401  (jit installs the memo)

SOURCE = """
import math

SCALE = 3.0

@numba.njit(inline="always")
def inner(v):
    return v * SCALE + 1.0

@numba.njit(inline="always")
def outer(v):
    if v > 0.0:
        return inner(v) + math.exp(-v)
    return inner(-v) * 0.5

def kernel(x, out):
    for i in range(x.size):
        out[i] = outer(x[i]) + outer(x[i] * 0.25) - inner(x[i])
"""


def _module():
    """A fresh namespace holding SOURCE's functions (its globals: the tests rebind them)."""
    space = {"numba": numba}
    exec(compile(SOURCE, "<inline_memo_test>", "exec"), space)
    return space


def _compiled(space, dtype):
    """`kernel` of `space` compiled afresh (no disk cache) for 1-D arrays of `dtype`."""
    fn = numba.njit(cache=False, error_model="numpy")(space["kernel"])
    x = np.linspace(-2.0, 2.0, 11).astype(dtype)
    out = np.empty_like(x)
    fn(x, out)
    return fn, out


def _normalised_asm(fn) -> str:
    """The assembly of `fn`'s one overload, the unique numbers in its names taken out."""
    (asm,) = fn.inspect_asm().values()
    asm = re.sub(r"_ZN[\w$.]*", "SYM", asm)
    asm = re.sub(r'"?\.bytes\.-?\d+"?', ".bytes", asm)
    return re.sub(r'"\.const\.missing Environment: SYM", \d+', ".const.env", asm)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_machine_code_as_numbas_own_inlining(dtype):
    with_memo = _compiled(_module(), dtype)
    inline_memo.uninstall()
    try:
        without = _compiled(_module(), dtype)
    finally:
        inline_memo.install()
    np.testing.assert_array_equal(with_memo[1], without[1])
    assert _normalised_asm(with_memo[0]) == _normalised_asm(without[0])


def test_each_function_translated_once(monkeypatch):
    translations = []
    real = inline_memo._translated.__wrapped__

    def counting(worker, func, enable_ssa=False):
        translations.append(func.__name__)
        return real(worker, func, enable_ssa)
    monkeypatch.setattr(inline_memo, "_translated", inline_memo._memoised(counting))
    space = _module()
    _compiled(space, np.float64)
    _compiled(space, np.float32)       # another kernel, other types: the same IR
    assert sorted(translations) == ["inner", "outer"]


def test_a_rebound_global_is_translated_afresh():
    space = _module()
    before = _compiled(space, np.float64)[1]
    space["SCALE"] = 5.0                # inner's global, inlined into outer too
    after = _compiled(space, np.float64)[1]
    x = np.linspace(-2.0, 2.0, 11)

    def expected(scale):
        def inner(v):
            return v * scale + 1.0

        def outer(v):
            return inner(v) + np.exp(-v) if v > 0.0 else inner(-v) * 0.5
        return np.array([outer(v) + outer(v * 0.25) - inner(v) for v in x])
    np.testing.assert_allclose(before, expected(3.0), rtol=1e-15)
    np.testing.assert_allclose(after, expected(5.0), rtol=1e-15)


def test_a_rebound_function_is_translated_afresh():
    space = _module()
    _compiled(space, np.float64)
    inner = space["inner"]
    space["inner"] = numba.njit(inline="always")(lambda v: v * 0.0)
    _, out = _compiled(space, np.float64)
    x = np.linspace(-2.0, 2.0, 11)
    # outer's cached IR inlined the old inner: it must not be reused
    expected = [(np.exp(-v) if v > 0.0 else 0.0) + (np.exp(-v / 4) if v > 0.0 else 0.0)
                for v in x]
    np.testing.assert_allclose(out, expected, rtol=1e-15)
    assert inner is not space["inner"]


def test_a_numba_with_another_inliner_keeps_its_own(monkeypatch):
    """install() leaves InlineWorker alone where its methods' parameters are not the ones
    the memo stands in for."""
    from numba.core import inline_closurecall as icc

    from engine.backends.cpu import inline_memo
    assert inline_memo.supported()
    monkeypatch.setitem(inline_memo._EXPECTED, "inline_ir", ("self", "caller_ir"))
    assert not inline_memo.supported()
    inline_memo.uninstall()
    try:
        own = icc.InlineWorker.inline_function
        inline_memo.install()
        assert icc.InlineWorker.inline_function is own
    finally:
        monkeypatch.undo()
        inline_memo.install()
    assert getattr(icc.InlineWorker.inline_function, "_gradverify_memo", False)
