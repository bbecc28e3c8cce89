"""Optimizers on float16 and bfloat16 parameters: state in float32, the parameter rounded
once per step, on store (engine.ops.optimizer_steps.state_dtype)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine.errors import ShapeError
from engine.ops.optimizer_steps import state_dtype
from engine.optim import make_optimizer
from engine.optim.checkpoint import load_checkpoint, save_checkpoint
from engine.registry import OPS
from engine.tensor import DTYPES, Flag, Tensor

HALF = ("f16", "bf16")
SETTINGS = {
    "sgd": dict(lr=0.1, momentum=0.9, dampening=0.2, weight_decay=0.05),
    "adam": dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1, amsgrad=True),
    "adamw": dict(lr=0.05, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
}


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16 if a.dtype.itemsize == 2 else np.uint32)


def _stepper(name, dtype, p0, kwargs):
    p = engine.param(p0.shape, dtype, name="w").set(p0)
    return p, make_optimizer(name, [p], **kwargs)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_state_is_float32_for_16_bit_params_and_the_params_own_dtype_otherwise(name, dtype):
    _, opt = _stepper(name, dtype, np.ones(3), SETTINGS[name])
    want = DTYPES["f32"] if dtype in HALF else DTYPES[dtype]
    arrays = opt.state_arrays()
    assert arrays.pop("w.step").dtype == np.float64
    assert arrays and all(a.dtype == want for a in arrays.values())
    assert state_dtype(DTYPES[dtype]) == want


def _steps_agree(name, dtype, p0, grads, kwargs):
    """k steps of the 16-bit optimizer against the float32 one whose parameter is rounded to
    the 16-bit dtype (numpy / ml_dtypes astype, to nearest even) after every step: the same
    parameter bits and the same float32 state bits, step after step."""
    half_dt = DTYPES[dtype]
    p16, opt16 = _stepper(name, dtype, p0.astype(half_dt), kwargs)
    p32, opt32 = _stepper(name, "f32", p0.astype(half_dt).astype(np.float32), kwargs)
    for g in grads:
        g16 = g.astype(half_dt)
        opt16.grads[p16].set(g16)
        opt32.grads[p32].set(g16.astype(np.float32))
        opt16.step()
        opt32.step()
        want = p32.numpy().astype(half_dt)           # the float32 step, rounded once
        assert np.array_equal(_bits(p16.numpy()), _bits(want))
        s16, s32 = opt16.state_arrays(), opt32.state_arrays()
        for k in s32:
            assert s16[k].dtype == s32[k].dtype
            assert np.array_equal(_bits(s16[k]), _bits(s32[k])), k   # never rounded to 16 bits
        assert np.array_equal(_bits(opt16.grads[p16].numpy()), _bits(g16))  # grad untouched
        p32.set(want.astype(np.float32))             # the float32 side keeps 16-bit values
    return opt16


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(SETTINGS))
def test_a_16_bit_step_is_the_float32_step_rounded_once(name, dtype):
    rng = np.random.default_rng(1)
    p0 = rng.uniform(-2, 2, (4, 5))
    opt = _steps_agree(name, dtype, p0, [rng.uniform(-1, 1, (4, 5)) for _ in range(5)],
                       SETTINGS[name])
    moments = [a for k, a in opt.state_arrays().items() if not k.endswith(".step")]
    # float32 state holds values no 16-bit dtype can: it was not rounded through one
    assert any(not np.array_equal(m, m.astype(DTYPES[dtype]).astype(np.float32))
               for m in moments)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(list(SETTINGS)), dtype=st.sampled_from(HALF),
       lr=st.floats(1e-4, 0.5), wd=st.sampled_from([0.0, 0.01, 0.3]),
       maximize=st.booleans(), flag=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_property_16_bit_steps_are_rounded_float32_steps(name, dtype, lr, wd, maximize, flag,
                                                          seed):
    rng = np.random.default_rng(seed)
    kwargs = dict(lr=lr, weight_decay=wd, maximize=maximize)
    if name == "sgd":
        kwargs.update(momentum=0.9, nesterov=flag)
    else:
        kwargs.update(amsgrad=flag)
    p0 = rng.uniform(-3, 3, (7,)) * rng.choice([1.0, 1e-3], 7)
    grads = [rng.standard_normal(7) * 10.0 ** rng.uniform(-3, 1) for _ in range(3)]
    _steps_agree(name, dtype, p0, grads, kwargs)


@pytest.mark.parametrize("dtype", HALF)
def test_steps_refuse_state_or_gradients_of_another_dtype(dtype):
    p = engine.param((3,), dtype, name="w")
    step = Tensor((1,), "f64", name="step", flags=Flag.STATE)
    hp = Tensor((4,), "f64", name="hp", flags=Flag.INPUT)
    grad = Tensor((3,), dtype, name="g", flags=Flag.INPUT)
    with pytest.raises(ShapeError, match="dtype float32"):
        OPS["sgd_step"].build(p, grad, step, hp, Tensor((3,), dtype, name="buf",
                                                        flags=Flag.STATE))
    with pytest.raises(ShapeError, match=f"dtype {DTYPES[dtype]}"):
        OPS["sgd_step"].build(p, Tensor((3,), "f32", name="g32", flags=Flag.INPUT), step, hp,
                              Tensor((3,), "f32", name="buf", flags=Flag.STATE))


@pytest.mark.parametrize("dtype", HALF)
def test_checkpoint_of_16_bit_params_and_float32_state_resumes_bit_for_bit(dtype, tmp_path):
    rng = np.random.default_rng(2)
    p0, grads = rng.uniform(-1, 1, (6,)), [rng.uniform(-1, 1, (6,)) for _ in range(6)]

    def run(opt, p, gs):
        for g in gs:
            opt.grads[p].set(g.astype(DTYPES[dtype]))
            opt.step()

    p, opt = _stepper("adam", dtype, p0, SETTINGS["adam"])
    run(opt, p, grads)
    q, resumed = _stepper("adam", dtype, p0, SETTINGS["adam"])
    run(resumed, q, grads[:3])
    save_checkpoint(tmp_path / "c.gguf", [q], resumed)
    r, loaded = _stepper("adam", dtype, np.zeros(6), SETTINGS["adam"])
    load_checkpoint(tmp_path / "c.gguf", [r], loaded)
    assert all(a.dtype == np.float32 for k, a in loaded.state_arrays().items()
               if not k.endswith(".step"))
    run(loaded, r, grads[3:])
    assert np.array_equal(_bits(r.numpy()), _bits(p.numpy()))
    for k, a in opt.state_arrays().items():
        assert np.array_equal(loaded.state_arrays()[k], a), k
