"""What the families share: the settings an engine optimizer takes (read from its
constructor, never from an error message) and their validation."""

from __future__ import annotations

import pytest

from engine.errors import HyperparameterError
from optcheck.harness import engine_options, engine_settings, refused_settings, to_engine_kwargs


def test_engine_options_are_the_constructor_keywords():
    assert engine_options("sgd") == ("lr", "momentum", "dampening", "weight_decay",
                                     "nesterov", "maximize")
    for name in ("adam", "adamw"):
        assert engine_options(name) == ("lr", "betas", "eps", "weight_decay", "amsgrad",
                                        "maximize")


def test_betas_become_one_keyword():
    assert to_engine_kwargs("adam", {"lr": 0.1, "beta2": 0.9}, {"amsgrad": True}) == {
        "lr": 0.1, "betas": (0.9, 0.9), "amsgrad": True}


@pytest.mark.parametrize("name, hp, flags, refused", [
    ("sgd", {"lr": 0.1, "beta1": 0.9, "beta2": 0.99}, {}, ["betas"]),
    ("sgd", {"eps": 1e-3, "beta1": 0.9, "beta2": 0.99}, {"amsgrad": True},
     ["eps", "betas", "amsgrad"]),
    ("adam", {"momentum": 0.9, "dampening": 0.1}, {"nesterov": True, "maximize": True},
     ["momentum", "dampening", "nesterov"]),
    ("adamw", {"lr": 0.1, "eps": 0.0, "weight_decay": 0.1}, {"amsgrad": True}, []),
])
def test_refused_settings_in_keyword_order(name, hp, flags, refused):
    assert refused_settings(name, hp, flags) == refused


def test_engine_settings_fill_in_the_defaults():
    hp, flags = engine_settings("adamw", {"lr": 0.01}, {"amsgrad": True})
    assert hp == {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
    assert flags == {"amsgrad": True, "maximize": False}


@pytest.mark.parametrize("name, hp, flags, message", [
    ("sgd", {"beta1": 0.9, "beta2": 0.99}, {}, "sgd takes no betas"),
    ("adam", {"momentum": 0.9}, {"nesterov": True}, "adam takes no momentum, nesterov"),
    ("adam", {"lr": -1.0}, {}, "adam: lr must be >= 0"),
    ("sgd", {}, {"nesterov": True}, "sgd: nesterov needs momentum > 0"),
])
def test_engine_settings_refuse_and_name_the_bad_setting(name, hp, flags, message):
    with pytest.raises(HyperparameterError, match=message):
        engine_settings(name, hp, flags)
