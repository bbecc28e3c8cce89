"""The MNIST commands refuse a bad GRADVERIFY_THREADS in one line, before any work."""

from __future__ import annotations

import pytest

from mnist_target.cli import regress_main


@pytest.mark.parametrize("value", ["abc", "0"])
def test_a_bad_thread_setting_is_one_usage_line(value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GRADVERIFY_THREADS", value)
    assert regress_main(["--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"mnist-regress: GRADVERIFY_THREADS must be a whole number in [1, 512], got {value!r}\n")
