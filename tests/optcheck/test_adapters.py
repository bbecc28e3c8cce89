"""Optimizer adapters (optcheck.adapters, optcheck.api): torch.optim's three
implementations, a numpy update from Python and a user's module:attribute, each run by the
families that step any optimizer; a known bug is caught, bad input is one line or an error
row that says what was wrong."""

from __future__ import annotations

import pytest

from optcheck import closed_form, reference
from optcheck.adapters import AdapterError, get_adapter
from optcheck.api import OptimizerCheckFailure, assert_optimizer, check_optimizer
from optcheck.cli import main
from tests.optcheck import numpy_adamw

pytest.importorskip("torch")


@pytest.mark.parametrize("name", ["torch", "torch-foreach", "torch-fused"])
@pytest.mark.parametrize("rule", ["sgd", "adamw"])
def test_torch_implementations_follow_the_float64_reference(name, rule):
    rows = reference.run(rule, "f64", steps=30, adapter=get_adapter(name))
    assert rows and all(r.status == "pass" for r in rows), [r.message for r in rows]
    assert any("amsgrad" in r.name or "nesterov" in r.name for r in rows)


def test_closed_forms_run_on_torch_and_the_toy_model_says_it_is_ours_only():
    rows = closed_form.run("adam", "f32", steps=20, adapter=get_adapter("torch-foreach"))
    statuses = {r.status for r in rows}
    assert statuses == {"pass", "unsupported"}
    assert all("toy" in r.name for r in rows if r.status == "unsupported")


def test_a_hand_written_numpy_adamw_passes():
    rows = assert_optimizer(numpy_adamw.init, numpy_adamw.update, "adamw",
                            hparams={"lr": 0.01, "weight_decay": 0.1}, steps=30)
    assert sum(r.status == "pass" for r in rows) > 20
    assert rows[-1].labels["check"] == "user" and rows[-1].status == "pass"


def test_eps_inside_the_square_root_is_caught_where_eps_matters():
    rows = check_optimizer(numpy_adamw.init, numpy_adamw.update_eps_inside_sqrt, "adamw",
                           dtypes=("f64",), steps=30)
    failed = [r for r in rows if r.status == "fail"]
    assert failed, "a bug that moves eps must fail some row"
    assert any("eps=0.1" in r.name for r in failed if r.labels["family"] == "reference")
    assert all("first diverged at step" in r.message for r in failed)
    with pytest.raises(OptimizerCheckFailure, match="first diverged"):
        assert_optimizer(numpy_adamw.init, numpy_adamw.update_eps_inside_sqrt, "adamw",
                         dtypes=("f64",), steps=30)


def test_an_update_returning_the_wrong_shape_is_an_error_row_that_says_so():
    rows = check_optimizer(numpy_adamw.init, numpy_adamw.update_wrong_shape, "adamw",
                           dtypes=("f64",), steps=5)
    errors = [r for r in rows if r.status == "error"]
    assert errors and all("update returned w0 of shape" in r.message for r in errors)


def test_another_rule_is_unsupported_with_its_reason():
    rows = reference.run("sgd", "f64", steps=5, adapter=numpy_adamw.AdamWAdapter())
    assert {r.status for r in rows} == {"unsupported"}
    assert "implements adamw, not sgd" in rows[0].message


def test_hparams_the_rule_does_not_take_are_refused():
    with pytest.raises(ValueError, match="adamw takes no momentum"):
        check_optimizer(numpy_adamw.init, numpy_adamw.update, "adamw",
                        hparams={"lr": 0.1, "momentum": 0.9})


def test_the_command_line_runs_a_module_attribute_adapter(capsys):
    code = main(["--engine", "tests.optcheck.numpy_adamw:AdamWAdapter", "--opt", "adamw",
                 "--dtype", "f64", "--steps", "10", "--no-progress", "--verbose"])
    out = capsys.readouterr().out
    assert code == 0 and "reference" in out and "UNSUPPORTED" in out.upper()


@pytest.mark.parametrize("engine, text", [
    ("nope", "unknown engine 'nope'"),
    ("tests.optcheck.no_such_module:A", "cannot import tests.optcheck.no_such_module"),
    ("tests.optcheck.numpy_adamw:np", "is not an adapter"),
])
def test_a_bad_engine_is_one_line_and_exit_2(engine, text, capsys):
    assert main(["--engine", engine, "--opt", "adamw", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert text in err and len(err.strip().splitlines()) == 1


def test_the_plugin_takes_the_engine_as_the_request_does():
    from optcheck.request import OptcheckRequest
    options = dict(OptcheckRequest.plugin_options())
    assert "engine" in options
    assert "--optcheck-engine=torch" in OptcheckRequest(engine="torch").plugin_args()


def test_get_adapter_refuses_what_is_not_an_adapter():
    with pytest.raises(AdapterError, match="lacks"):
        get_adapter("tests.optcheck.numpy_adamw:np")
