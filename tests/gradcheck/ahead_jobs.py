"""For tests/gradcheck/test_ahead.py: a request whose jobs say which process ran them and
fire numba's compile event (as a kernel compiling would), importable in the helper
processes checkkit.ahead starts; and an adapter that does the same in a worker process."""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import types

import numba.core.event as numba_event

from checkkit.jobs import Job, Plan
from checkkit.request import Request


def fire(module: str = "engine.backends.cpu.softmax") -> None:
    """numba's "numba:compile" event for a stand-in kernel of `module`."""
    func = types.FunctionType(compile("def f(): pass", "<k>", "exec").co_consts[0], {})
    func.__module__ = module
    dispatcher = types.SimpleNamespace(py_func=func)
    with numba_event.trigger_event("numba:compile", data={"dispatcher": dispatcher}):
        pass


@dataclasses.dataclass(frozen=True)
class MarkingRequest(Request):
    """`n` jobs in blocks of `block` per op ("op0", "op1", ...); each appends "PID INDEX" to
    `log`, fires a compilation when `compiles`, and sleeps `delay` seconds in the process
    `slow_pid` (the run's: the helpers outrun it); job `fails_elsewhere` raises in any
    other process, where each job sleeps `delay_elsewhere` seconds."""

    log: str
    slow_pid: int
    n: int = 30
    block: int = 5
    compiles: bool = True
    delay: float = 0.1
    fails_elsewhere: int = -1       # the job that raises in any process but slow_pid's
    delay_elsewhere: float = 0.0    # seconds each job sleeps in any other process
    tool = "marking"

    def plan(self) -> Plan:
        jobs = [Job(f"op{i // self.block}(case={i})", functools.partial(_mark, self, i),
                    {"op": f"op{i // self.block}"}) for i in range(self.n)]
        return Plan(self.tool, jobs, "marking jobs", {})


def _mark(request: MarkingRequest, i: int) -> list:
    with open(request.log, "a") as f:
        f.write(f"{os.getpid()} {i}\n")
    if request.compiles:
        fire()
    if os.getpid() == request.slow_pid:
        time.sleep(request.delay)
    else:
        time.sleep(request.delay_elsewhere)
        if i == request.fails_elsewhere:
            raise RuntimeError(f"job {i} fails outside the run")
    return [i]


def marks(log) -> dict[int, list[int]]:
    """The indices each process ran, by pid, in order."""
    by: dict[int, list[int]] = {}
    for line in open(log).read().split("\n"):
        if line:
            pid, i = map(int, line.split())
            by.setdefault(pid, []).append(i)
    return by


class CompilingAdapter:
    """A worker's adapter whose `vjp` fires a compilation of a kernel in rope's module."""

    name = "compiling"

    def vjp(self, *args):
        fire("engine.backends.cpu.rope")
        return "done"


def make(name, **options):
    return CompilingAdapter()
