"""Things that are not a regular file, put where the MNIST commands and the IDX reader expect
one, and what each is called in the one-line refusal."""

from __future__ import annotations

import os

SPECIAL = {"fifo": "not a regular file (it is a FIFO)",
           "dev-zero": "not a regular file (it is a character device)",
           "loop": "a symbolic link loop (too many levels of symbolic links)",
           "broken link": "a symbolic link to a missing file",
           "directory": "not a regular file (it is a directory)"}


def make_special(path, kind: str):
    """`path` made a thing of `kind` (a key of SPECIAL, or "none": nothing there); `path`."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "broken link":
        path.symlink_to(path.parent / f"nowhere{path.suffix}")
    elif kind == "directory":
        path.mkdir()
    elif kind != "none":
        raise ValueError(f"unknown kind {kind!r}")
    return path
