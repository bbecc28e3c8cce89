"""The public API from the package itself: `from optcheck import check_optimizer, ...`
(every name in optcheck.__all__), loaded lazily (tests/gradcheck/test_exports.py checks
that `import optcheck` stays light and that the docs' imports work)."""

from __future__ import annotations

import importlib

import pytest

import optcheck


def test_every_name_in_all_imports_from_the_package():
    assert {"check_optimizer", "assert_optimizer", "OptimizerAdapter", "Stepper",
            "get_adapter"} <= set(optcheck.__all__)
    for name in optcheck.__all__:
        module = importlib.import_module(optcheck._EXPORTS[name])
        assert getattr(optcheck, name) is getattr(module, name), name
    namespace = {}
    exec("from optcheck import *", namespace)
    assert set(optcheck.__all__) <= set(namespace)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'check_nothing'"):
        optcheck.check_nothing  # noqa: B018
