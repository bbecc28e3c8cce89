"""MNIST tests never write the user's cache: every test gets a cache directory of the
session's own."""

import signal

import pytest


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gradverify-cache")


@pytest.fixture(autouse=True)
def _private_cache(monkeypatch, _session_cache):
    monkeypatch.setenv("GRADVERIFY_CACHE", str(_session_cache))


@pytest.fixture(scope="session")
def mnist(_session_cache):
    """Real MNIST (mnist_target.data.MnistData) from the default source, cached in the
    session's own directory; skips without torch or without a source."""
    pytest.importorskip("torch")
    from mnist_target.data import MnistDataError, load_mnist
    try:
        return load_mnist(cache_dir=_session_cache)
    except MnistDataError as exc:
        pytest.skip(f"no MNIST source: {exc}")


@pytest.fixture
def no_hang():
    """Fails the test, instead of hanging the run, if it blocks for 5 s (a FIFO or a
    device opened and waited on)."""
    def alarm(signum, frame):
        raise TimeoutError("blocked: a FIFO or device was waited on")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
