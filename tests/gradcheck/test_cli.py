"""The gradcheck CLI: verdicts, exit codes, injected bugs caught."""

from __future__ import annotations

import pytest

from gradcheck.cli import main


def test_relu_passes(capsys):
    assert main(["--op", "relu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "relu(type=f32,x=[3,4])" in out and "PASS" in out and "FAIL" not in out


@pytest.mark.parametrize("op", ["relu", "sum", "div", "pool_2d", "conv_2d",
                                "cross_entropy_loss"])
def test_injected_scale_bug_is_caught(op, capsys):
    assert main(["--op", op, "--dtype", "f64", "--inject", "scale:1.01", "--no-progress"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_injected_bug_caught_in_f32_at_one_percent(capsys):
    assert main(["--op", "relu", "--dtype", "f32", "--inject", "scale:1.01",
                 "--no-progress"]) == 1


def test_unknown_op_is_a_usage_error(capsys):
    assert main(["--op", "pool3d"]) == 2
    err = capsys.readouterr().err
    assert "unknown op 'pool3d'" in err and "pool_2d" in err


def test_filter_matching_nothing_is_a_usage_error(capsys):
    assert main(["--op", "relu", "-k", "no-such-case"]) == 2


def test_bad_mutation_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--op", "relu", "--inject", "flip"])
    assert exc.value.code == 2


def test_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("pool_2d", "conv_2d", "cross_entropy_loss", "argmax", "im2col_back"):
        assert name in out


def test_filter_and_dtype(capsys):
    assert main(["--op", "sum", "--dtype", "f64", "-k", "x=[3,4]", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "type=f32" not in out and "x=[3,4]" in out
