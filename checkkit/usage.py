"""The command lines' argument parser: argparse's, with usage errors in one line; and the
one-line form of a warning that every tool prints (warning_line).

    p = ArgumentParser(prog="gradcheck", description=...)
    p.parse_args(["--op"])   # stderr: gradcheck: error: argument --op: expected one
                             # argument (see gradcheck --help); exit status 2

The standard library only: the console scripts import it before anything heavy.

An unknown name (an op, an engine, an option's choice) is refused with the closest known
ones (difflib), not with the list of every name:

    unknown_name("op", "pool2d", all_ops(), "gradcheck --list")
    # "unknown op 'pool2d'; did you mean pool_2d? (gradcheck --list shows all)"
"""

from __future__ import annotations

import argparse
import difflib

# the packages whose warning categories say nothing their messages do not
_OURS = {"engine", "checkkit", "gradcheck", "optcheck", "reports", "mnist_target"}


def warning_line(tool: str, message, category) -> str:
    """One warning as the tools print it: `tool: warning: [Category: ]message`, its
    whitespace (newlines too) collapsed; the category left out for a plain UserWarning and
    for our own packages' categories."""
    try:
        text = " ".join(str(message).split())
    except Exception:          # a warning object whose str() fails: still one line
        text = f"(a {type(message).__name__} that cannot be shown)"
    plain = category is UserWarning or category.__module__.split(".")[0] in _OURS
    return f"{tool}: warning: {text}" if plain else \
        f"{tool}: warning: {category.__name__}: {text}"


def one_line(text: str) -> str:
    """`text` with its unprintable characters (a newline, a tab, ESC) escaped as Python
    writes them: a message that quotes what a user typed stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def close_matches(name: str, known) -> list[str]:
    """The known names closest to `name`, compared case-insensitively: those of difflib's
    best similarity ratio, if that is at least 0.6 (at most three, in `known`'s order)."""
    lowered = {str(k).lower(): str(k) for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=3)

    def ratio(k):
        return difflib.SequenceMatcher(None, name.lower(), k).ratio()
    best = max(map(ratio, close), default=None)
    return [lowered[k] for k in lowered if k in close and ratio(k) == best]


def did_you_mean(name: str, known) -> str:
    """"; did you mean X?" (or "X or Y?") for the known names closest to `name`; "" when
    none is close."""
    matches = close_matches(name, known)
    if not matches:
        return ""
    *first, last = matches
    return f"; did you mean {', '.join(first) + ' or ' if first else ''}{last}?"


def unknown_name(kind: str, name: str, known, listing: str) -> str:
    """The one line that refuses an unknown `kind` called `name`: "unknown KIND 'NAME'; did
    you mean X? (LISTING)", where `listing` says where every name is (e.g. "gradcheck
    --list shows all", or "known: a, b, c")."""
    return f"unknown {kind} {one_line(repr(name))}{did_you_mean(name, known)} ({listing})"


def format_warnings_as(tool: str) -> None:
    """Every warning from now on printed as warning_line(tool, ...), one line."""
    import warnings
    warnings.formatwarning = (lambda message, category, filename, lineno, line=None:
                              warning_line(tool, message, category) + "\n")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line, `PROG: error: MESSAGE (see
    PROG --help)`, and exit status 2: argparse's own prints the whole usage block first,
    which for these tools is longer than the message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")

    def _check_value(self, action, value):
        # argparse's "invalid choice: 'x' (choose from ...)", with the closest choices first
        if action.choices is not None and value not in action.choices \
                and isinstance(value, str):
            choices = [str(c) for c in action.choices]
            hint = did_you_mean(value, choices)
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{hint} (choose from {', '.join(choices)})")
        super()._check_value(action, value)

    def _get_values(self, action, arg_strings):
        # Python 3.11's argparse drops the '--' of `--opt=--` and hands the option an empty
        # list, which no choices check or type conversion sees: say what was given instead
        if action.option_strings and action.nargs in (None, argparse.OPTIONAL) \
                and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected one argument, "
                       f"got '--'")
        return super()._get_values(action, arg_strings)
