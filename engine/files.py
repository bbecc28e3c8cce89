"""Writing files: the one atomic writer that every output of every tool goes through.

    with atomic_write("model.gguf") as f:      # a binary file; in place only on success
        f.write(header)
        f.write(data)
    write_atomic("report.json", text)          # the same for text (UTF-8) or bytes at once
    problem = first_unwritable(out, graph_out) # "cannot write PATH: why", before a long run

GGUF models, graph files and checkpoints (engine.gguf_io), reports (reports.output, also
the pytest plugin's --gradcheck-json), the MNIST target's models, graphs, reports and data
cache: all are written here, and nowhere else opens a user's path for writing (a test scans
the sources for it). Where an output goes:

- a regular file, new or old, is written to a temporary file beside it (`.NAME.XXXX.tmp`,
  created as any new file is: mode 0o666 less the umask), flushed and fsync'ed, then moved
  onto it with os.replace; readers see the old file or the new one, never half of one. A
  replaced file keeps its mode. Its directory must exist and be writable;
- a symlink is written through: the whole chain is followed to its target, which is
  replaced as above (the link stays a link); a dangling link creates its target, as a
  shell's `>` would; a chain that never ends is refused as a "symlink loop";
- the process's own descriptors (/dev/stdin, /dev/stdout, /dev/stderr, /dev/fd/N,
  /proc/self/fd/N, /proc/<pid>/fd/N) are written straight into, whatever they point at, as
  bash does: replacing the file behind a redirected stdout would lose it;
- FIFOs and character devices (/dev/null, /dev/full, a terminal) are written straight into:
  nothing can be renamed onto them, so there is no temporary file; other special files
  (block devices, sockets) and directories are refused;
- an existing file the user cannot write is refused ("read-only"), and so, root included,
  is one whose mode has no write bit at all.

Every failure is a WriteError (an EngineError and an OSError) whose message is one line,
"cannot write PATH: why": a refusal by the rules above, a full disk (/dev/full: "No space
left on device"), EIO, a directory that vanished, an interrupted write. The previous file
is then left as it was and the temporary file removed; only a SIGKILL between its creation
and the rename can leave one behind. An OSError raised inside an `atomic_write` block is
taken as the write failing; any other exception passes through unchanged (after the same
clean-up). Imports the standard library and engine.errors only (layer 1).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import sys
from collections.abc import Iterator
from typing import BinaryIO

from engine.errors import EngineError

_MAX_LINKS = 40                  # as Linux's MAXSYMLINKS
_TEMP_NAME_BYTES = 120           # of the target's name kept in the temporary file's name
_DESCRIPTOR = re.compile(r"/dev/(?:(?P<std>stdin|stdout|stderr)|fd/(?P<fd>\d+))"
                         r"|/proc/(?P<pid>self|thread-self|\d+)/fd/(?P<pfd>\d+)")
_STD_FDS = {"stdin": 0, "stdout": 1, "stderr": 2}


class WriteError(EngineError, OSError):
    """A file that could not be written. `path` is the path as given, `reason` why (one
    line), `errno` the system's error number when the system refused (else None)."""

    def __init__(self, path, reason: str, code: int | None = None):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"cannot write {shown(self.path)}: {reason}")
        self.errno = code       # after __init__: OSError(message) leaves it None


def shown(path) -> str:
    """`path` as a message shows it: quoted when it is empty or holds a character that
    would split or hide it (a newline, an escape)."""
    text = os.fsdecode(path)
    return text if text.isprintable() and text else repr(text)


# --- where an output goes --------------------------------------------------------------------

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
                raise WriteError(path, "symlink loop", errno.ELOOP) from None
            return current, False        # not a link (or missing): the target itself
        current = os.path.join(os.path.dirname(current), link)
    raise WriteError(path, "symlink loop", errno.ELOOP)


def _check_descriptor(path: str, target: str) -> None:
    """WriteError unless descriptor `target` (one of ours) is open, for writing."""
    fd = _descriptor(target)[1]
    if fd is None:
        return
    try:
        os.fstat(fd)
    except (OSError, OverflowError):
        raise WriteError(path, f"descriptor {fd} is not open", errno.EBADF) from None
    try:  # POSIX only; elsewhere the write itself tells
        import fcntl
    except ImportError:
        return
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        raise WriteError(path, f"descriptor {fd} is open for reading only", errno.EBADF)


def _missing_directory(directory: str) -> str:
    return (f"{shown(directory)} is not a directory" if os.path.lexists(directory)
            else f"directory {shown(directory)} does not exist")


def resolve(path) -> tuple[str, str]:
    """(the file `path` leads to, how it is written: "descriptor", "straight" or "replace")
    by the rules of the module docstring; WriteError naming `path` and the problem."""
    try:
        return _locate(os.fsdecode(path))
    except ValueError as exc:            # a NUL byte, a name the file system cannot encode
        raise WriteError(path, f"not a usable file name ({exc})") from None


def _locate(path: str) -> tuple[str, str]:
    """resolve's work, on a path given as text."""
    if path == "":
        raise WriteError(path, "an empty path", errno.ENOENT)
    target, descriptor = _follow(path)
    if descriptor:
        _check_descriptor(path, target)
        return target, "descriptor"
    try:
        info = os.stat(target)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WriteError(path, "symlink loop", errno.ELOOP) from None
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise WriteError(path, exc.strerror or str(exc), exc.errno) from None
        info = None
    if info is not None:
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise WriteError(path, "it is a directory", errno.EISDIR)
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            raise WriteError(path, "it is not a regular file, FIFO or character device",
                             errno.EACCES)
        if mode & 0o222 == 0 or not os.access(target, os.W_OK):
            ours = mode & 0o222 == 0 or info.st_uid == os.geteuid()
            raise WriteError(path, "it is read-only (chmod u+w to allow)" if ours
                             else "it is read-only for this user (owned by another)",
                             errno.EACCES)
        if not stat.S_ISREG(mode):
            return target, "straight"
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise WriteError(path, _missing_directory(directory), errno.ENOENT)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteError(path, f"directory {shown(directory)} is not writable", errno.EACCES)
    return target, "replace"


def unwritable(path) -> str | None:
    """Why `path` cannot be written, checked before a long run (None if it can): the rules
    of the module docstring (links followed to their target, symlink loops, special files,
    read-only files, the target's directory missing or not writable) and an empty path. A
    full disk or a device that refuses data (/dev/full) only shows when written."""
    try:
        resolve(path)
    except WriteError as exc:
        return exc.reason
    return None


def _identity(path) -> tuple | None:
    """What `path` names, to compare outputs: (device, inode) of an existing file, else the
    path its links lead to; None for a character device, which any number may share."""
    target, how = resolve(path)
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
            return f"cannot write {shown(path)}: {problem}"
        key = _identity(path)
        if key in seen:
            also = "" if shown(seen[key]) == shown(path) else f" (also as {shown(seen[key])})"
            return f"{shown(path)} is given as two outputs{also}"
        if key is not None:
            seen[key] = path
    return None


# --- writing ---------------------------------------------------------------------------------

@contextlib.contextmanager
def _failures_named(path: str) -> Iterator[None]:
    """An OSError inside becomes a WriteError naming `path`."""
    try:
        yield
    except WriteError:
        raise
    except OSError as exc:
        raise WriteError(path, exc.strerror or str(exc), exc.errno) from exc


@contextlib.contextmanager
def atomic_write(path) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new contents into, by the rules of the module
    docstring: a regular file is replaced when the block ends without an exception, and is
    left as it was (the temporary file removed) when it raises; a FIFO, a character device
    or a descriptor receives the bytes as they are written. WriteError naming `path` for a
    path refused by the rules or a write that fails (an OSError inside the block is taken
    as one); other exceptions pass through."""
    path = os.fspath(path)
    target, how = resolve(path)
    if how == "replace":
        with _replacing(path, target) as f:
            yield f
        return
    with _failures_named(path), _straight(path, target, how == "descriptor") as f:
        yield f


@contextlib.contextmanager
def _replacing(path: str, target: str) -> Iterator[BinaryIO]:
    """A temporary file beside `target`, moved onto it when the block succeeds."""
    directory = os.path.dirname(target)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        mode = None                      # a new file: the mode os.open gives it
    temp, fd = _create_temp(path, target)
    try:
        with _failures_named(path), open(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(temp, target)
        except OSError as exc:
            reason = _missing_directory(directory) if exc.errno == errno.ENOENT \
                and not os.path.isdir(directory) else exc.strerror or str(exc)
            raise WriteError(path, reason, exc.errno) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_directory(directory)


def _create_temp(path: str, target: str) -> tuple[str, int]:
    """(name, descriptor) of a new empty file beside `target`, created as any new file is
    (0o666 less the umask, by the kernel), with a name no other writer picks."""
    directory, base = os.path.split(target)
    base = os.fsdecode(os.fsencode(base)[:_TEMP_NAME_BYTES])   # room for the suffix
    for _ in range(100):
        temp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOCTTY
                                 | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            reason = _missing_directory(directory) if exc.errno in (errno.ENOENT,
                                                                    errno.ENOTDIR) \
                else f"directory {shown(directory)} is not writable" \
                if exc.errno == errno.EACCES else exc.strerror or str(exc)
            raise WriteError(path, reason, exc.errno) from exc
    raise WriteError(path, f"no free temporary file name in {shown(directory)}",
                     errno.EEXIST)


def _sync_directory(directory: str) -> None:
    """Make the rename durable where the platform allows it. Best effort: the new file is
    in place whatever this says."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _straight(path: str, target: str, descriptor: bool) -> Iterator[BinaryIO]:
    """A FIFO, a character device or a descriptor, opened for writing straight into: our
    own descriptors through a duplicate (sharing the offset, as bash's `>/dev/fd/N` does),
    others by opening them (another process's descriptor: appending)."""
    fd = _descriptor(target)[1] if descriptor else None
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):   # what was printed comes first
            with contextlib.suppress(Exception):
                stream.flush()
        fd = os.dup(fd)
    else:
        flags = os.O_WRONLY | os.O_NOCTTY | (os.O_APPEND if descriptor else 0)
        fd = os.open(target, flags | getattr(os, "O_CLOEXEC", 0))
        mode = os.fstat(fd).st_mode
        if not (descriptor or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            os.close(fd)                 # swapped for another file since it was checked
            raise WriteError(path, "it changed while being written; nothing written")
    with open(fd, "wb") as f:
        yield f


def write_atomic(path, data: bytes | str) -> None:
    """Write `data` (bytes, or text as UTF-8) to `path` in one atomic_write; WriteError
    naming the path and why."""
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeError as exc:
            raise WriteError(path, f"text is not valid UTF-8: {exc}") from exc
    with atomic_write(path) as f:
        f.write(data)
