"""The fuzz suite's child process: runs many jobs in one interpreter under a memory bound.

    python -m tests.fuzz.child LIMIT_BYTES      (started by tests.fuzz.runner.Child)

RLIMIT_AS is set before anything large is imported. Requests and replies are pickled,
length-prefixed, on the file descriptors that were stdin and stdout; those two and stderr
are then pointed elsewhere (stdin at /dev/null, stdout and stderr at the current job's
capture files), so a library that writes to fd 1 or 2 cannot garble the protocol.

Jobs: ("load", surface, path, option) calls a library loader and returns its outcome;
("cli", tool, argv, cwd) runs a command line's main in-process, as its console script does
(SystemExit caught, an uncaught exception printed as Python would), with stdout and stderr
captured in files encoded as Python's own streams are.
"""

from __future__ import annotations

import os
import pickle
import resource
import struct
import sys
import traceback


def _bound_memory(limit: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard if hard != -1 and hard < limit
                                            else limit))


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(n))


def _write(stream, message) -> None:
    raw = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(raw)) + raw)
    stream.flush()


# --- loads -----------------------------------------------------------------------------------

def _classes(exc: BaseException) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]


def _checkpoint_state(params, opt):
    return ([p.numpy().copy() for p in params], {k: v.copy() for k, v in
                                                 opt.state_arrays().items()},
            dict(opt.hparams), opt.base_lr)


def _same_state(a, b) -> bool:
    import numpy as np
    (pa, sa, ha, la), (pb, sb, hb, lb) = a, b
    return (all(np.array_equal(x, y, equal_nan=True) for x, y in zip(pa, pb, strict=True))
            and sa.keys() == sb.keys()
            and all(np.array_equal(sa[k], sb[k], equal_nan=True) for k in sa)
            and repr(ha) == repr(hb) and repr(la) == repr(lb))


def _load(surface: str, path: str, option):
    """What the loader of `surface` made of `path`: ("ok", summary) or ("error", classes,
    message); ("changed", message) when a refused checkpoint changed the params."""
    from engine.errors import EngineError
    try:
        if surface == "gguf":
            from engine.gguf_io import load_gguf
            gf = load_gguf(path)
            return ("ok", f"{gf.arch}: {len(gf.tensors)} tensors")
        if surface == "model":
            from mnist_target.models import load_model_or_graph
            return ("ok", load_model_or_graph(path).arch)
        if surface == "graph":
            from engine.graph_io import load_graph
            loaded = load_graph(path)
            try:   # a graph that loads must also run (its kernels get checked shapes)
                loaded.graph.compute()
            except EngineError:
                pass
            return ("ok", f"{len(loaded.graph.nodes)} nodes")
        if surface == "checkpoint":
            from engine.optim.checkpoint import load_checkpoint
            from tests.fuzz.files import checkpoint_params
            params, opt = checkpoint_params(option)
            before = _checkpoint_state(params, opt)
            try:
                load_checkpoint(path, params, opt)
            except BaseException as exc:
                if not _same_state(before, _checkpoint_state(params, opt)):
                    return ("changed", f"{type(exc).__name__}: {exc}")
                raise
            return ("ok", "loaded")
        if surface in ("idx_images", "idx_labels"):
            from mnist_target.idx import read_idx_images, read_idx_labels
            read = read_idx_images if surface == "idx_images" else read_idx_labels
            return ("ok", str(read(path).shape))
        if surface == "idx_dir":
            from mnist_target.idx import idx_source
            return ("ok", str(idx_source(path).decode().train_images.shape))
        raise ValueError(f"unknown surface {surface!r}")
    except Exception as exc:   # noqa: BLE001  (classified by the test)
        return ("error", _classes(exc), str(exc),
                "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:])


# --- command lines ---------------------------------------------------------------------------

def main_of(tool: str):
    """The `main(argv)` of the command line `tool` (gradcheck, optcheck, mnist-*)."""
    if tool == "gradcheck":
        from gradcheck.cli import main
        return main
    if tool == "optcheck":
        from optcheck.cli import main
        return main
    from mnist_target.cli import command_main
    return lambda argv: command_main(tool.removeprefix("mnist-"), argv)


class _Captured:
    """fds 1 and 2 and sys.stdout / sys.stderr pointed at two files for one job."""

    def __init__(self, directory: str):
        self.paths = [os.path.join(directory, n) for n in ("stdout", "stderr")]

    def __enter__(self):
        self.saved = (sys.stdout, sys.stderr)
        for fd, path in zip((1, 2), self.paths, strict=True):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.stdout = open(1, "w", encoding="utf-8", errors="strict", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        return self

    def __exit__(self, *exc):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001  (an encoding error on flush: already reported)
                pass
        sys.stdout, sys.stderr = self.saved

    def texts(self) -> tuple[str, str]:
        out = []
        for path in self.paths:
            with open(path, "rb") as f:
                out.append(f.read(200_000).decode("utf-8", "backslashreplace"))
        return out[0], out[1]


def _cli(tool: str, argv: list[str], cwd: str, private: str):
    import warnings

    from checkkit.console import one_line_warnings
    from engine.backends.cpu import threads
    saved_filters, saved_format = list(warnings.filters), warnings.formatwarning
    saved_threads, home = threads.get_num_threads(), os.getcwd()
    os.chdir(cwd)
    try:
        with _Captured(private) as captured:
            one_line_warnings(tool)
            try:
                rc = main_of(tool)(list(argv))
            except SystemExit as exc:
                code = exc.code
                if code is None or isinstance(code, int):
                    rc = code or 0
                else:
                    print(code, file=sys.stderr)
                    rc = 1
            except BaseException:   # noqa: BLE001  (what Python would print and exit 1 with)
                traceback.print_exc()
                rc = 1
        stdout, stderr = captured.texts()
    finally:
        os.chdir(home)
        warnings.filters[:] = saved_filters
        warnings.formatwarning = saved_format
        threads.set_num_threads(saved_threads)
    return ("done", rc, stdout, stderr)


def main() -> None:
    limit, private = int(sys.argv[1]), sys.argv[2]
    _bound_memory(limit)
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    log = os.open(os.path.join(private, "child.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    import faulthandler
    faulthandler.enable(open(os.path.join(private, "faults.log"), "a"))  # noqa: SIM115
    import gradcheck.cli  # noqa: F401  (the imports first: the parent waits for "ready")
    import mnist_target.cli  # noqa: F401
    import optcheck.cli  # noqa: F401
    _write(replies, ("ready", os.getpid()))
    while True:
        request = _read(requests)
        if request is None:
            return
        try:
            if request[0] == "load":
                reply = _load(*request[1:])
            else:
                reply = _cli(*request[1:], private)
        except BaseException as exc:   # noqa: BLE001  (the harness's own failure)
            reply = ("harness", f"{type(exc).__name__}: {exc}", traceback.format_exc())
        _write(replies, reply)


if __name__ == "__main__":
    main()
