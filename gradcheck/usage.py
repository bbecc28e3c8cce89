"""The command lines' argument parser: argparse's, with usage errors in one line.

    p = ArgumentParser(prog="gradcheck", description=...)
    p.parse_args(["--op"])   # stderr: gradcheck: error: argument --op: expected one
                             # argument (see gradcheck --help); exit status 2
"""

from __future__ import annotations

import argparse


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line, `PROG: error: MESSAGE (see
    PROG --help)`, and exit status 2: argparse's own prints the whole usage block first,
    which for these tools is longer than the message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
