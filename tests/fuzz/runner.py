"""The parent's side of the fuzz child (tests.fuzz.child): start it, send jobs, bound time.

    child = Child(private_dir)
    outcome = child.run(("cli", "gradcheck", ["--op", "relu"], cwd), timeout=60)

A job that takes longer than its timeout kills the child (its own process, by pid) and
comes back as ("hang", seconds); a child that dies (a signal, the memory bound) comes back as
("died", how, the tail of its log). Either way the next job starts a fresh child.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the address space of the child: numba, LLVM, torch and the engine's thread pool take about
# 1.2 GiB of it (VmPeak after importing the three command lines and running a small check)
MEMORY_LIMIT = 4 * 2**30
START_TIMEOUT = 120.0


class Child:
    def __init__(self, private: str | os.PathLike[str], env: dict[str, str] | None = None):
        self.private = os.fspath(private)
        os.makedirs(self.private, exist_ok=True)
        self.env = {**os.environ, **(env or {})}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [self.env.get("PYTHONPATH")])])
        self.env.setdefault("NO_COLOR", "1")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.child", str(MEMORY_LIMIT), self.private],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(ROOT), env=self.env,
            start_new_session=True)
        self.starts += 1
        reply = self._receive(START_TIMEOUT)
        if not (isinstance(reply, tuple) and reply[0] == "ready"):
            self.close()
            raise RuntimeError(f"the fuzz child did not start: {reply!r}; log: {self.log()}")

    def log(self) -> str:
        try:
            with open(os.path.join(self.private, "child.log"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 2000))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _receive(self, timeout: float):
        stream = self.proc.stdout
        deadline = time.monotonic() + timeout
        raw = b""
        while True:
            need = 8 if len(raw) < 8 else 8 + struct.unpack("<Q", raw[:8])[0]
            if len(raw) >= need and len(raw) > 8:
                return pickle.loads(raw[8:need])
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                return ("hang", timeout)
            ready, _, _ = select.select([stream], [], [], left)
            if ready:
                chunk = os.read(stream.fileno(), 1 << 20)
                if not chunk:
                    code = self.proc.wait()
                    self.close()
                    how = (f"signal {signal.Signals(-code).name}" if code < 0
                           else f"exit status {code}")
                    return ("died", how, self.log())
                raw += chunk

    def run(self, job: tuple, timeout: float):
        if self.proc is None:
            self._start()
        raw = pickle.dumps(job)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(raw)) + raw)
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.close()
            return ("died", "its pipe closed", self.log())
        return self._receive(timeout)

    def close(self) -> None:
        if self.proc is None:
            return
        try:   # the child and what it started (ggml's workers): its own process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc = None
