"""The command lines' parser: a usage error is one line and exit status 2."""

from __future__ import annotations

import pytest

from checkkit.usage import ArgumentParser
from gradcheck import cli as gradcheck_cli
from optcheck import cli as optcheck_cli


@pytest.mark.parametrize("main, argv, says", [
    (gradcheck_cli.main, ["--op"], "argument --op: expected one argument"),
    (gradcheck_cli.main, ["--op", "relu", "--mode", "x"], "invalid choice: 'x'"),
    (gradcheck_cli.main, [], "one of the arguments"),
    (optcheck_cli.main, ["--bogus"], "unrecognized arguments: --bogus"),
    (optcheck_cli.main, ["--steps", "many"], "invalid int value: 'many'"),
    # Python 3.11's argparse used to hand `--opt=--` an empty list (a TypeError later)
    (optcheck_cli.main, ["--opt=--"], "argument --opt: expected one argument, got '--'"),
    (gradcheck_cli.main, ["--op=--"], "argument --op: expected one argument, got '--'"),
    # what the user typed is quoted with its newline escaped
    (optcheck_cli.main, ["--opt", "sgd", "--", "x\ny"], r"unrecognized arguments: -- x\ny"),
])
def test_a_usage_error_is_one_line_naming_the_help(capsys, main, argv, says):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err
    prog = err.split(":")[0]
    assert err.startswith(f"{prog}: error: ") and err.endswith(f"(see {prog} --help)\n")


def test_help_is_still_the_whole_usage(capsys):
    with pytest.raises(SystemExit) as info:
        ArgumentParser(prog="tool", description="does things").parse_args(["--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: tool [-h]")
