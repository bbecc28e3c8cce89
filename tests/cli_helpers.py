"""Shared by the command lines' tests (gradcheck, optcheck, mnist): a stderr that is a
terminal, the progress check every command makes, and a Ctrl-C in the middle of a run."""

from __future__ import annotations

import io
import sys


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def assert_progress_only_on_a_terminal(main, argv, calls, monkeypatch):
    """`main(argv)` asks for a progress bar when stderr is a terminal only, and not with
    --no-progress: `calls` is the list of progress flags its stand-in recorded."""
    main(argv)
    monkeypatch.setattr(sys, "stderr", Tty())
    main(argv)
    main([*argv, "--no-progress"])
    assert calls == [False, True, False]


def interrupt_after(monkeypatch, module, name: str, n: int):
    """Ctrl-C (a KeyboardInterrupt) in the (n+1)-th call of `module.name`, the earlier calls
    run by the real one."""
    real, calls = getattr(module, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, interrupted)


def assert_unwritable_output_refused(main, argv, tmp_path, capsys):
    """`main(argv)` with an --output in a missing directory: exit 2 before running."""
    assert main([*argv, "--output", str(tmp_path / "no" / "r.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def assert_empty_output_refused(main, argv, capsys, prog: str):
    """`main(argv)` with `--output ''` (which used to print the report to stdout and exit
    0): exit 2, nothing on stdout, one line naming it."""
    assert main([*argv, "--output", "", "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"{prog}: cannot write '': an empty path"]
