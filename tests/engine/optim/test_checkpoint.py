"""Checkpoints (engine.optim.checkpoint): a corrupt or foreign file is refused whole, naming the
file and the key or tensor, and leaves the parameters and the optimizer exactly as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import gguf_io
from engine.errors import HyperparameterError
from engine.gguf_io import GGUFFormatError, load_gguf, save_gguf
from engine.optim import SGD, Adam, AdamW
from engine.optim.checkpoint import load_checkpoint, save_checkpoint


def trained(cls=AdamW, steps=2, **kwargs):
    x = engine.param((2, 3), name="x")
    x.set(np.arange(6.0).reshape(2, 3))
    opt = cls([x], **kwargs)
    for i in range(steps):
        opt.grads[x].set(np.cos(x.numpy() * (i + 1)))
        opt.step()
    return x, opt


def fresh(cls=AdamW, **kwargs):
    y = engine.param((2, 3), name="x")
    y.set(np.full((2, 3), 7.0))
    return y, cls([y], **kwargs)


def snapshot(param, opt):
    return param.numpy().copy(), opt.state_arrays(), opt.hparams, opt.base_lr


def same(a, b):
    (pa, sa, ha, la), (pb, sb, hb, lb) = a, b
    return (np.array_equal(pa, pb) and sa.keys() == sb.keys() and ha == hb and la == lb
            and all(np.array_equal(sa[k], sb[k]) for k in sa))


def rewrite(path, metadata=None, tensors=None):
    """The checkpoint at `path` with some metadata values and tensors replaced (None drops)."""
    gf = load_gguf(path)
    meta = {k: v for k, v in {**gf.metadata, **(metadata or {})}.items() if v is not None}
    arrays = {k: v for k, v in {**gf.tensors, **(tensors or {})}.items() if v is not None}
    save_gguf(path, arrays, gf.arch, meta)
    return path


@pytest.fixture
def ckpt(tmp_path):
    x, opt = trained(amsgrad=True)
    save_checkpoint(tmp_path / "c.gguf", [x], opt)
    return tmp_path / "c.gguf"


def refused(path, match, cls=AdamW, **kwargs):
    y, opt = fresh(cls, **kwargs)
    before = snapshot(y, opt)
    with pytest.raises(GGUFFormatError, match=match) as info:
        load_checkpoint(path, [y], opt)
    assert str(info.value).startswith(str(path))
    assert same(snapshot(y, opt), before)
    return str(info.value)


def test_a_good_checkpoint_restores_everything(ckpt):
    y, opt = fresh(amsgrad=True)
    load_checkpoint(ckpt, [y], opt)
    x, want = trained(amsgrad=True)
    assert same(snapshot(y, opt), snapshot(x, want)) and opt.step_count == 2


@pytest.mark.parametrize("key, value, match", [
    ("lr", -1.0, r"optimizer\.hp\.\*: adamw: lr must be >= 0, got -1\.0"),
    ("lr", math.nan, r"optimizer\.hp\.\*: lr must be finite, got nan"),
    ("eps", math.inf, r"eps must be finite"),
    ("lr", "fast", r"lr must be a number, got 'fast'"),
    ("lr", True, r"lr must be a number, got True"),
    ("beta1", 1.0, r"beta1 must lie in \[0, 1\)"),
    ("weight_decay", None, r"no optimizer\.hp\.weight_decay in the file"),
])
def test_bad_hyperparameters_are_refused_and_nothing_changes(ckpt, key, value, match):
    refused(rewrite(ckpt, {f"optimizer.hp.{key}": value}), match, amsgrad=True)


@pytest.mark.parametrize("value, match", [
    ("false", r"optimizer\.flag\.amsgrad is 'false', not a GGUF BOOL"),
    (0, r"optimizer\.flag\.amsgrad is 0, not a GGUF BOOL"),
    (None, r"optimizer\.flag\.amsgrad is None, not a GGUF BOOL"),
    (False, r"optimizer flag amsgrad=False in the file, but the optimizer has amsgrad=True"),
])
def test_flags_must_be_bools_equal_to_the_optimizers(ckpt, value, match):
    refused(rewrite(ckpt, {"optimizer.flag.amsgrad": value}), match, amsgrad=True)


def test_unknown_optimizer_keys_are_refused(ckpt):
    refused(rewrite(ckpt, {"optimizer.hp.momentum": 0.5}),
            r"unknown optimizer key\(s\) 'optimizer\.hp\.momentum'", amsgrad=True)


def test_an_unknown_key_with_a_newline_is_named_in_one_line(ckpt):
    message = refused(rewrite(ckpt, {"optimizer.hp.b\neta": 0.5}), "unknown", amsgrad=True)
    assert "\n" not in message and r"'optimizer.hp.b\neta'" in message


def f32(value):
    return np.full((2, 3), value, np.float32)


@pytest.mark.parametrize("name, value, match", [
    ("x.step", np.array([-5.0]), r"tensor 'x\.step' holds step count -5\.0; a step count is a"),
    ("x.step", np.array([2.5]), r"tensor 'x\.step' holds step count 2\.5"),
    ("x.step", np.array([math.nan]), r"tensor 'x\.step' holds NaN or infinite values"),
    ("x", f32(math.nan), r"tensor 'x' holds NaN or infinite values"),
    ("x.exp_avg", f32(math.inf), r"tensor 'x\.exp_avg' holds NaN or infinite"),
    ("x.exp_avg_sq", f32(-1.0), r"tensor 'x\.exp_avg_sq' holds negative values"),
    ("x.max_exp_avg_sq", f32(-1.0), r"'x\.max_exp_avg_sq' holds negative values"),
    ("x.exp_avg", np.zeros(6, np.float32), r"'x\.exp_avg' has shape \[6\], expected \[2, 3\]"),
    ("x.exp_avg", np.zeros((2, 3)), r"'x\.exp_avg' has dtype float64, expected float32"),
    ("x.exp_avg", None, r"missing 'x\.exp_avg'"),
])
def test_corrupt_tensors_are_refused_and_nothing_changes(ckpt, name, value, match):
    refused(rewrite(ckpt, tensors={name: value}), match, amsgrad=True)


def test_step_counters_must_agree(tmp_path):
    a, b = engine.param((2,), name="a"), engine.param((3,), name="b")
    opt = SGD([a, b], lr=0.1, momentum=0.9)
    save_checkpoint(tmp_path / "c.gguf", [a, b], opt)
    rewrite(tmp_path / "c.gguf", tensors={"b.step": np.array([3.0])})
    c, d = engine.param((2,), name="a"), engine.param((3,), name="b")
    opt2 = SGD([c, d], lr=0.5, momentum=0.1)
    with pytest.raises(GGUFFormatError, match=r"the step counters differ \(a\.step=0, b\.step=3"):
        load_checkpoint(tmp_path / "c.gguf", [c, d], opt2)
    assert opt2.hparams["lr"] == 0.5


def test_params_alone_never_read_the_state(ckpt, monkeypatch):
    reads = []
    read = gguf_io._BoundedReader.read_tensor
    monkeypatch.setattr(gguf_io._BoundedReader, "read_tensor",
                        lambda self, t: reads.append(t.name) or read(self, t))
    y = engine.param((2, 3), name="x")
    load_checkpoint(ckpt, [y])
    assert reads == ["x"]


@settings(max_examples=40, deadline=None)
@given(key=st.sampled_from(["lr", "beta1", "beta2", "eps", "weight_decay"]),
       value=st.one_of(st.floats(), st.integers(-3, 3), st.booleans(), st.text(max_size=3)))
def test_loading_accepts_exactly_what_set_accepts(tmp_path_factory, key, value):
    path = tmp_path_factory.mktemp("c") / "c.gguf"
    x, opt = trained(Adam)
    save_checkpoint(path, [x], opt)
    rewrite(path, {f"optimizer.hp.{key}": value})
    y, probe = fresh(Adam)
    try:
        probe.checked_hparams(**{key: value})
        accepted = True
    except HyperparameterError:
        accepted = False
    before = snapshot(y, probe)
    if accepted:
        load_checkpoint(path, [y], probe)
        assert probe.hparams[key] == float(value)
    else:
        with pytest.raises(GGUFFormatError, match=r"c\.gguf: optimizer\.hp\.\*: "):
            load_checkpoint(path, [y], probe)
        assert same(snapshot(y, probe), before)
