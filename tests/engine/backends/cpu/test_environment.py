"""Settings from the environment (engine.backends.cpu.environment): never an import error."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from engine.backends.cpu import environment, jit
from engine.backends.cpu.environment import SettingWarning


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a directory")
    return path


def test_an_unwritable_cache_dir_falls_back_to_a_users_temporary_one(a_file, tmp_path,
                                                                     monkeypatch):
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(environment, "fallback_cache_dir", lambda: str(fallback))
    env = {"NUMBA_CACHE_DIR": str(a_file / "cache")}
    with pytest.warns(SettingWarning, match="NUMBA_CACHE_DIR .* cannot be written; using"):
        assert environment.usable_cache_dir(env) == str(fallback)
    assert env == {"NUMBA_CACHE_DIR": str(fallback)} and fallback.is_dir()


def test_with_no_writable_fallback_numba_keeps_its_own_locations(a_file, monkeypatch):
    monkeypatch.setattr(environment, "fallback_cache_dir", lambda: str(a_file / "too"))
    env = {"NUMBA_CACHE_DIR": str(a_file / "cache")}
    with pytest.warns(SettingWarning, match="numba's default cache locations"):
        assert environment.usable_cache_dir(env) is None
    assert env == {}


def test_a_writable_cache_dir_is_left_alone(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "new")}
    assert environment.usable_cache_dir(env) == str(tmp_path / "new")
    assert env == {"NUMBA_CACHE_DIR": str(tmp_path / "new")}


def test_an_unset_cache_dir_becomes_the_tools_cache_directorys_numba(tmp_path):
    env = {"GRADVERIFY_CACHE": str(tmp_path / "g")}
    assert environment.usable_cache_dir(env) == str(tmp_path / "g" / "numba")
    assert env["NUMBA_CACHE_DIR"] == str(tmp_path / "g" / "numba")
    assert (tmp_path / "g" / "numba").is_dir()


def test_the_default_root_is_checkkits_cache_directorys_numba(tmp_path, monkeypatch):
    """The engine cannot import checkkit (layers): its copy of the rule must agree."""
    from checkkit.cache import default_cache_dir
    for env in ({"GRADVERIFY_CACHE": str(tmp_path / "g")},
                {"XDG_CACHE_HOME": str(tmp_path / "x")},
                {"HOME": str(tmp_path / "home")}):
        for name in ("GRADVERIFY_CACHE", "XDG_CACHE_HOME", "HOME"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert environment.default_numba_cache_dir() == str(default_cache_dir() / "numba")


def test_an_unwritable_default_root_falls_back_silently(a_file, tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "fallback_cache_dir", lambda: str(tmp_path / "fb"))
    env = {"GRADVERIFY_CACHE": str(a_file)}
    assert environment.usable_cache_dir(env) == str(tmp_path / "fb")
    assert env["NUMBA_CACHE_DIR"] == str(tmp_path / "fb")


def test_the_fallback_is_per_user_under_the_temporary_directory():
    import tempfile
    assert os.path.dirname(environment.fallback_cache_dir()) == tempfile.gettempdir()


def test_a_kernel_numba_cannot_cache_compiles_uncached_with_a_warning(monkeypatch):
    from numba.core import caching
    monkeypatch.setattr(caching.CacheImpl, "_locator_classes", [])
    monkeypatch.setitem(jit.OPTIONS, "cache", True)

    def twice(x):
        return 2 * x

    with pytest.warns(SettingWarning, match="no disk cache"):
        compiled = jit.kernel(twice)
    assert compiled(np.float64(3.0)) == 6.0 and jit.OPTIONS["cache"] is False


@pytest.mark.parametrize("value, problem", [
    ("maybe", "GRADVERIFY_PARALLEL must be 1 or 0 (on or off), got 'maybe'"),
    ("on", None), ("0", None), ("", None)])
def test_parallel_flag_problems(value, problem):
    assert environment.environment_problem({"GRADVERIFY_PARALLEL": value}) == problem


def test_importing_the_engine_with_bad_settings_warns_and_works(a_file):
    """A library user: bad GRADVERIFY_THREADS, GRADVERIFY_PARALLEL, an unwritable
    NUMBA_CACHE_DIR and no place numba may cache in: warnings, and kernels still run."""
    code = ("import engine, numpy as np\n"
            "from engine import ops\n"
            "x = engine.param((3,), name='x'); x.set(np.array([-1.0, 2.0, 3.0], 'f4'))\n"
            "y = ops.relu(x).set_output(); g = engine.Graph([y]); g.compute()\n"
            "print(y.numpy().tolist())\n")
    env = dict(os.environ, GRADVERIFY_THREADS="abc", GRADVERIFY_PARALLEL="maybe",
               NUMBA_CACHE_DIR=str(a_file / "cache"),
               NUMBA_CACHE_LOCATOR_CLASSES="IPythonCacheLocator")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0.0, 2.0, 3.0]"
    for words in ("GRADVERIFY_THREADS must be a whole number in [1, 512], got 'abc'",
                  "GRADVERIFY_PARALLEL must be 1 or 0", "cannot be written",
                  "no disk cache"):
        assert words in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("numba_first", [False, True])
def test_importing_the_engine_points_numba_at_the_one_root(tmp_path, numba_first):
    """NUMBA_CACHE_DIR unset: the engine sets it to <GRADVERIFY_CACHE>/numba before numba
    caches anything, even where numba was imported first; processes it starts inherit it."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GRADVERIFY_CACHE"] = str(tmp_path / "g")
    code = ("import os, sys\n" + ("import numba\n" if numba_first else "") +
            "import engine, numba.core.config as c\n"
            "print(c.CACHE_DIR)\nprint(os.environ['NUMBA_CACHE_DIR'])")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path / "g" / "numba")] * 2
