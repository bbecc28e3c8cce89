"""How a worker process that died or hung is described, from what it left behind.

A crash row's message names how the process ended (`exit_description`: the signal or exit
status), the tail of what it wrote to its standard error (`stderr_tail`: an assertion's
text, `GGML_ASSERT(...) failed`, repeats collapsed) and the innermost Python frame it was in
(`innermost_frame`, from the traceback faulthandler wrote).
"""

from __future__ import annotations

import signal

STDERR_TAIL_LINES = 6
STDERR_TAIL_CHARS = 800


def collapse_repeats(lines: list[str]) -> list[str]:
    """`lines` with each repeated line kept once, where it first appears, and marked with
    its count: ['a failed', 'b', 'a failed'] -> ['a failed (x2)', 'b']. Threads that fail
    the same assertion at once each print it."""
    counts: dict[str, int] = {}
    for line in lines:
        counts[line] = counts.get(line, 0) + 1
    return [line if n == 1 else f"{line} (x{n})" for line, n in counts.items()]


def stderr_tail(path: str, offset: int = 0) -> str:
    """The last distinct lines written to `path` after `offset` (repeats collapsed, see
    collapse_repeats), joined by ' | '."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = collapse_repeats([line.strip() for line in text.splitlines() if line.strip()])
    joined = " | ".join(lines[-STDERR_TAIL_LINES:])
    return joined if len(joined) <= STDERR_TAIL_CHARS else "..." + joined[-STDERR_TAIL_CHARS:]


def innermost_frame(fault_path: str) -> str:
    """The most recent Python frame of the traceback faulthandler wrote, e.g.
    'File "x.py", line 12 in vjp'."""
    try:
        with open(fault_path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    frames = [line.strip() for line in lines if line.strip().startswith("File ")]
    return frames[0] if frames else ""


def exit_description(exitcode: int | None) -> str:
    """How a process ended, in words: 'killed by SIGABRT (signal 6)', 'exited with status 3'."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-exitcode})"
    return f"exited with status {exitcode}"
