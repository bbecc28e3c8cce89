"""One entry point for every rendering, a safe way to write it to a file, and the tail that
every command line tool shares.

    text = render(results, "json", "gradcheck", meta={"argv": argv})
    write_atomic("report.json", text)
    return emit(results, tool="gradcheck", fmt="plain", output=None)   # a CLI's last line
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Mapping

from reports.html_report import render_html
from reports.json_report import default_meta, render_json
from reports.junit import render_junit
from reports.record import exit_status
from reports.table import (
    NO_TERMINAL,
    Terminal,
    render_compact,
    render_grouped,
    render_table,
    summary_line,
)

FORMATS = ("plain", "github", "html", "json", "junit")
# The format a file name suggests, for tools that pick one from --output.
EXTENSION_FORMATS = {".txt": "plain", ".md": "github", ".html": "html", ".htm": "html",
                     ".json": "json", ".xml": "junit"}


class OutputError(Exception):
    """A report that could not be written; says which path and why."""

    def __init__(self, path, reason: str):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {_shown(self.path)}: {reason}")


def _shown(path) -> str:
    # An empty path would vanish from a message, a newline would split it: quote those.
    text = os.fsdecode(path)
    return text if text.isprintable() and text else repr(text)


def format_for_path(path, default: str = "plain") -> str:
    """The format that `path`'s extension suggests (.json, .html, .xml, .md, .txt)."""
    return EXTENSION_FORMATS.get(os.path.splitext(os.fspath(path))[1].lower(), default)


def render(results, fmt: str, tool: str, meta: Mapping | None = None,
           figures: list[str] | None = None, group_by: str | None = None, *,
           verbose: bool = False, terminal: Terminal = NO_TERMINAL) -> str:
    """`results` in format `fmt` (one of FORMATS), as text ending with a newline.

    plain: the compact report (reports.table.render_compact: the tool's few columns fitted
    to `terminal`, a summary per group, the failures in full, the summary line); with
    `verbose`, and always for github: every column, then the summary line (github: a blank
    line between, so Markdown does not read the summary as a row). html: a page titled
    "<tool> report".
    json: the results document. junit: one testsuite named after the tool.
    `meta` (e.g. {"argv": [...]}) is added to the default version and time for html, json
    and junit. `figures`: extra HTML fragments for the html page (ignored otherwise).
    `group_by`: a label; verbose plain and github then give one table per value of it,
    compact plain a summary row per value.
    """
    results = list(results)
    if fmt == "plain" and not verbose:
        return render_compact(results, tool, group_by, terminal) + "\n"
    if fmt in ("plain", "github") and group_by:
        return render_grouped(results, fmt, group_by) + "\n"
    if fmt in ("plain", "github"):
        sep = "\n\n" if fmt == "github" else "\n"
        return render_table(results, fmt) + sep + summary_line(results) + "\n"
    full_meta = {**default_meta(), **(meta or {})}
    if fmt == "html":
        return render_html(results, f"{tool} report", full_meta, figures)
    if fmt == "json":
        return render_json(results, tool, full_meta)
    if fmt == "junit":
        return render_junit(results, tool, full_meta)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def _umask() -> int:
    # os.umask can only be read by setting it; put it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# The rules of where an output goes are in write_atomic's docstring.
_MAX_LINKS = 40                  # as Linux's MAXSYMLINKS
_DESCRIPTOR = re.compile(r"/dev/(?:(?P<std>stdin|stdout|stderr)|fd/(?P<fd>\d+))"
                         r"|/proc/(?P<pid>self|thread-self|\d+)/fd/(?P<pfd>\d+)")
_STD_FDS = {"stdin": 0, "stdout": 1, "stderr": 2}


def _descriptor(path: str) -> tuple[bool, int | None]:
    """(whether `path` names a process's descriptor, its number when it is one of ours)."""
    match = _DESCRIPTOR.fullmatch("/" + os.path.normpath(path).lstrip("/"))
    if match is None:
        return False, None
    if match["std"]:
        return True, _STD_FDS[match["std"]]
    if match["fd"]:
        return True, int(match["fd"])
    ours = match["pid"] in ("self", "thread-self") or int(match["pid"]) == os.getpid()
    return True, int(match["pfd"]) if ours else None


def _follow(path: str) -> tuple[str, bool]:
    """(the path that `path` leads to after every symlink, whether that is a descriptor).
    Followed hop by hop, not by os.path.realpath alone, so that /dev/stdout is caught before
    it resolves to the file or `pipe:[N]` behind it."""
    current = os.path.join(os.getcwd(), path)
    for _ in range(_MAX_LINKS + 1):
        for candidate in (current, os.path.join(os.path.realpath(os.path.dirname(current)),
                                                os.path.basename(current))):
            if _descriptor(candidate)[0]:
                return candidate, True
        current = candidate
        try:
            link = os.readlink(current)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputError(path, "symlink loop") from None
            return current, False        # not a link (or missing): the target itself
        current = os.path.join(os.path.dirname(current), link)
    raise OutputError(path, "symlink loop")


def _check_descriptor(path: str, target: str) -> None:
    """OutputError unless descriptor `target` (one of ours) is open, for writing."""
    fd = _descriptor(target)[1]
    if fd is None:
        return
    try:
        os.fstat(fd)
    except (OSError, OverflowError):
        raise OutputError(path, f"descriptor {fd} is not open") from None
    try:  # POSIX only; elsewhere the write itself tells
        import fcntl
    except ImportError:
        return
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        raise OutputError(path, f"descriptor {fd} is open for reading only")


def _target(path) -> tuple[str, str]:
    """(the file `path` leads to, how to write it: "descriptor", "straight" or "replace"),
    by the rules of write_atomic; OutputError naming `path` and the problem otherwise."""
    try:
        return _locate(os.fsdecode(path))
    except ValueError as exc:            # a NUL byte, a name the file system cannot encode
        raise OutputError(path, f"not a usable file name ({exc})") from None


def _locate(path: str) -> tuple[str, str]:
    """_target's work, on a path given as text."""
    if path == "":
        raise OutputError(path, "an empty path")
    target, descriptor = _follow(path)
    if descriptor:
        _check_descriptor(path, target)
        return target, "descriptor"
    try:
        info = os.stat(target)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(path, "symlink loop") from None
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise OutputError(path, exc.strerror or str(exc)) from None
        info = None
    if info is not None:
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise OutputError(path, "it is a directory")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise OutputError(path, "it is not a regular file, FIFO or character device")
        if mode & 0o222 == 0 or not os.access(target, os.W_OK):
            ours = mode & 0o222 == 0 or info.st_uid == os.geteuid()
            raise OutputError(path, "it is read-only (chmod u+w to allow)" if ours
                              else "it is read-only for this user (owned by another)")
        if not stat.S_ISREG(mode):
            return target, "straight"
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise OutputError(path, f"directory {_shown(directory)} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise OutputError(path, f"directory {_shown(directory)} is not writable")
    return target, "replace"


def write_atomic(path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, or raise OutputError naming the path and why. Rules:

    - a regular file, new or old, is written through a temporary file beside it and
      os.replace: readers see the old file or the new one, never half of one, and on any
      failure the old file is left as it was; its directory must exist and be writable,
      and a replaced file keeps its mode;
    - a symlink is written through: the whole chain is followed to its target, which is
      replaced as above (the link stays a link); a dangling link creates its target, as a
      shell's `>` would; a chain that never ends is refused as a "symlink loop";
    - the process's own descriptors (/dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N,
      /proc/self/fd/N, /proc/<pid>/fd/N) are written straight into, whatever they point
      at, as bash does: replacing the file behind a redirected stdout would lose it;
    - FIFOs and character devices (/dev/null, a terminal) are written straight into: no
      temporary file, no rename; other special files (block devices, sockets) are refused;
    - an existing file the user cannot write is refused ("read-only"), and so, root
      included, is one whose mode has no write bit at all.
    """
    path = os.fspath(path)
    try:
        data = text.encode("utf-8")
    except UnicodeError as exc:
        raise OutputError(path, f"text is not valid UTF-8: {exc}") from exc
    target, how = _target(path)
    if how == "replace":
        _replace(path, target, data)
    else:
        _write_into(path, target, data, how == "descriptor")


def _replace(path: str, target: str, data: bytes) -> None:
    """Write `data` to regular file `target` through a temporary file and os.replace."""
    try:
        mode = os.stat(target).st_mode & 0o7777
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                   dir=os.path.dirname(target))
    except OSError as exc:
        raise OutputError(path, exc.strerror or str(exc)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(path, exc.strerror or str(exc)) from exc
        raise


def _write_into(path: str, target: str, data: bytes, descriptor: bool) -> None:
    """Write `data` straight into a FIFO, a character device or a descriptor: our own
    descriptors through a duplicate (sharing the offset, as bash's `>/dev/fd/N` does),
    others by opening them (another process's descriptor: appending)."""
    fd = _descriptor(target)[1] if descriptor else None
    try:
        if fd is not None:
            for stream in (sys.stdout, sys.stderr):   # what was printed comes first
                with contextlib.suppress(Exception):
                    stream.flush()
            fd = os.dup(fd)
        else:
            flags = os.O_WRONLY | os.O_NOCTTY | (os.O_APPEND if descriptor else 0)
            fd = os.open(target, flags)
            mode = os.fstat(fd).st_mode
            if not (descriptor or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
                os.close(fd)             # swapped for another file since it was checked
                raise OutputError(path, "it changed while being written; nothing written")
        with open(fd, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise OutputError(path, exc.strerror or str(exc)) from exc


def unwritable(path) -> str | None:
    """Why `path` cannot be written, checked before a long run (None if it can): the rules
    of write_atomic (links followed to their target, symlink loops, special files, read-only
    files, the target's directory missing or not writable) and an empty path."""
    try:
        _target(path)
    except OutputError as exc:
        return exc.reason
    return None


def _identity(path) -> tuple | None:
    """What `path` names, to compare outputs: (device, inode) of an existing file, else the
    path its links lead to; None for a character device, which any number may share."""
    target, how = _target(path)
    fd = _descriptor(target)[1] if how == "descriptor" else None
    try:
        info = os.fstat(fd) if fd is not None else os.stat(target)
    except OSError:
        return ("path", target)
    return None if stat.S_ISCHR(info.st_mode) else (info.st_dev, info.st_ino)


def first_unwritable(*paths) -> str | None:
    """"cannot write PATH: why" for the first of `paths` (None entries skipped; an empty
    path is refused) that cannot be written, or "PATH is given as two outputs" when two of
    them name the same file (the same target after links, or os.path.samefile): the second
    write would replace the first. Character devices (/dev/null) may be given twice.
    Checked before a long run; None when every one can be written."""
    seen: dict[tuple, str] = {}
    for path in paths:
        if path is None:
            continue
        problem = unwritable(path)
        if problem:
            return f"cannot write {_shown(path)}: {problem}"
        key = _identity(path)
        if key in seen:
            also = "" if _shown(seen[key]) == _shown(path) else f" (also as {_shown(seen[key])})"
            return f"{_shown(path)} is given as two outputs{also}"
        if key is not None:
            seen[key] = path
    return None


def emit(results, *, tool: str, fmt: str = "plain", output=None, meta: Mapping | None = None,
         figures: list[str] | None = None, group_by: str | None = None,
         echo_plain: bool = False, footer: str | None = None, verbose: bool = False) -> int:
    """The tail every command line tool shares: render `results` in `fmt`, write the text
    atomically to `output` (saying so on stderr) or to stdout, and return the exit status:
    0 all passed, 1 any failed, 2 when `output` cannot be written (one line on stderr).

    `echo_plain`: with an `output` in another format, also print the plain table to
    stdout. `footer`: a line printed after the report on stdout (not into a file).
    `verbose`: the plain table with every column. Plain text on a terminal fits its width
    (statuses coloured unless NO_COLOR); in a file or a pipe nothing is shortened."""
    results = list(results)
    if output is not None:
        text = render(results, fmt, tool, meta, figures, group_by, verbose=verbose)
        try:
            write_atomic(output, text)
        except OutputError as exc:
            print(f"{tool}: {exc}", file=sys.stderr)
            return 2
        print(f"{tool}: wrote {output} ({len(results)} results)", file=sys.stderr)
        if echo_plain and fmt != "plain":
            sys.stdout.write(render(results, "plain", tool, group_by=group_by,
                                    verbose=verbose, terminal=Terminal.of(sys.stdout)))
    else:
        sys.stdout.write(render(results, fmt, tool, meta, figures, group_by, verbose=verbose,
                                terminal=Terminal.of(sys.stdout)))
        if footer:
            print(footer)
    return exit_status(results)
