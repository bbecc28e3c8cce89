"""MNIST tests never write the user's cache: every test gets a cache directory of the
session's own."""

import pytest


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gradverify-cache")


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, _session_cache):
    monkeypatch.setenv("GRADVERIFY_CACHE", str(_session_cache))
