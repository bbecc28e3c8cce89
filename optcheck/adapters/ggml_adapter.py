"""ggml's optimizer steps as an optimizer adapter (optcheck.adapters.base): the ops
ggml_opt_step_adamw and ggml_opt_step_sgd on the CPU, through the one binding
(checkkit.ggml), fed as ggml-opt feeds them. Per element, at step t (ggml-cpu/ops.cpp):

    AdamW   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
            w = w (1 - alpha wd) - alpha (m beta1h) / (sqrt(v beta2h) + eps)
    SGD     w = w (1 - alpha wd) - alpha g

The hyperparameters are one F32 tensor, filled as ggml-opt's ggml_opt_eval fills it: AdamW
[alpha, beta1, beta2, eps, wd, beta1h, beta2h] with beta1h = 1 / (1 - beta1^t) and
beta2h = 1 / (1 - beta2^t) computed by the caller in float32 (`1.0f / (1.0f - powf(beta,
iter))`: bias_corrections, with the C library's powf); SGD [alpha, wd]. torch's settings
map as lr -> alpha and weight_decay -> wd: AdamW's decay is decoupled, as torch's; SGD's
w (1 - alpha wd) - alpha g is torch's L2 decay without momentum; Adam is AdamW with wd = 0.
What ggml has no counterpart for is an `unsupported` row that says so: Adam's L2 decay,
AMSGrad, maximize, SGD's momentum and Nesterov; float64 (ggml has no such tensors) and f16
or bf16 parameters (the ops' CPU kernels take F32 only and abort on any other type). The
asserts of ggml-opt (alpha > 0, betas and wd in [0, 1]) are ggml-opt's, not the ops': the
ops are called as they are.

A stepper owns one ggml context: per parameter w the tensors w (a param), its gradient, m
and v, per param group its hyperparameter tensor, and one graph of the steps, built and
planned once; a step writes the gradients and the hyperparameters and computes the graph.
The snapshot names m `w0.exp_avg`, v `w0.exp_avg_sq` and the step count `w0.step`, as
torch's state dict does (SGD has no state).

A failed GGML_ASSERT aborts the process, so the adapter is `isolated`: its steppers live in
a checkkit.worker.Worker child process, each by a key, and the stepper handed out is a proxy
whose step, snapshot, save and restore are calls there; an abort is a WorkerCrash (a
`crash` row) and the next stepper starts a fresh child. close() (or the end of the
process) stops the child.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import weakref

import numpy as np

from checkkit import ggml
from checkkit.loading import AdapterSpec
from checkkit.worker import Worker
from engine.tensor import DTYPES
from optcheck.adapters.base import Group

MAKER = "optcheck.adapters:get_adapter"
# the tensor types ggml has for optcheck's dtypes; its opt-step kernels take F32 only
TENSOR_TYPES = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16,
                "bf16": ggml.GGML_TYPE_BF16}
KERNEL_DTYPES = ("f32",)
STEPPER_METHODS = ("step", "snapshot", "save", "restore")
MEM_ALIGN = 16            # GGML_MEM_ALIGN: each tensor's data is padded to it


@functools.cache
def _powf():
    f = ctypes.CDLL(ctypes.util.find_library("m")).powf
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return f


def bias_corrections(beta1: float, beta2: float, t: int) -> tuple[np.float32, np.float32]:
    """(beta1h, beta2h) of step t as ggml_opt_eval computes them, in float32:
    1.0f / (1.0f - powf(beta, t))."""
    one = np.float32(1.0)
    with np.errstate(divide="ignore"):
        return tuple(one / (one - np.float32(_powf()(float(np.float32(b)), float(t))))
                     for b in (beta1, beta2))


def refused(optimizer: str, hp: dict, flags: dict) -> str | None:
    """Why ggml's opt steps cannot run these settings (None: they can)."""
    if flags.get("maximize"):
        return "ggml's optimizer steps only descend: no maximize"
    if optimizer == "sgd":
        if hp.get("momentum", 0.0) or flags.get("nesterov"):
            return ("ggml_opt_step_sgd is plain SGD with weight decay: no momentum buffer, so "
                    "no momentum, dampening or Nesterov")
        return None
    if flags.get("amsgrad"):
        return "ggml_opt_step_adamw has no AMSGrad (no running maximum of v)"
    if optimizer == "adam" and hp.get("weight_decay", 0.0):
        return ("ggml has no Adam with L2 weight decay: ggml_opt_step_adamw's decay is "
                "decoupled (AdamW); Adam runs as AdamW with wd = 0")
    return None


def dtype_refused(optimizer: str, dtype: str) -> str | None:
    """Why ggml's opt step cannot run `dtype` parameters (None: it can)."""
    if dtype in KERNEL_DTYPES:
        return None
    op = "ggml_opt_step_sgd" if optimizer == "sgd" else "ggml_opt_step_adamw"
    if dtype not in TENSOR_TYPES:
        return f"ggml has no {dtype} tensors; {op} computes in F32 only"
    return (f"{op}'s CPU kernel takes F32 parameters only; a {dtype} one aborts "
            f"(GGML_ABORT in ggml-cpu/ops.cpp)")


def step_params(optimizer: str, hp: dict, t: int) -> list:
    """The hyperparameter tensor's values for step t, as ggml_opt_eval writes them."""
    if optimizer == "sgd":
        return [hp["lr"], hp.get("weight_decay", 0.0)]
    beta1h, beta2h = bias_corrections(hp["beta1"], hp["beta2"], t)
    wd = hp.get("weight_decay", 0.0) if optimizer == "adamw" else 0.0
    return [hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], wd, beta1h, beta2h]


class _Stepper:
    """One ggml context and graph stepping every parameter of `groups` (module doc); lives
    in the worker process."""

    def __init__(self, adapter, optimizer: str, groups: list):
        lib = self.lib = adapter.lib
        self.optimizer, self.fill, self.t = optimizer, adapter.step_params, 0
        n_params = sum(len(g.init) for g in groups)
        n_tensors = 5 * n_params + len(groups)        # w, grad, m, v, the step; hp tensors
        graph_size = 2 * n_tensors + 16
        data = sum(np.asarray(v).size * DTYPES[g.dtype].itemsize + MEM_ALIGN
                   for g in groups for v in g.init.values())
        mem = (n_tensors * (lib.ggml_tensor_overhead() + MEM_ALIGN) + 4 * data + 4096
               + lib.ggml_graph_overhead_custom(graph_size, False))
        self.ctx = lib.ggml_init(ggml.InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init could not allocate a {mem}-byte context")
        try:
            self._build(optimizer, groups, graph_size, adapter.n_threads)
        except BaseException:
            self.free()
            raise

    def _build(self, optimizer: str, groups: list, graph_size: int, n_threads: int) -> None:
        lib, adam = self.lib, optimizer != "sgd"
        graph = lib.ggml_new_graph_custom(self.ctx, graph_size, False)
        self.groups, self.grads, self.tensors = [], {}, {}
        for group in groups:
            hp_tensor, hp_view = self._new((7 if adam else 2,), "f32")
            self.groups.append((group.hp, hp_view))
            for name, value in group.init.items():
                value = np.asarray(value)
                w, self.tensors[name] = self._new(value.shape, group.dtype)
                self.tensors[name][...] = value
                lib.ggml_set_param(w)
                g, self.grads[name] = self._new(value.shape, group.dtype)
                if adam:
                    m, self.tensors[f"{name}.exp_avg"] = self._new(value.shape, group.dtype)
                    v, self.tensors[f"{name}.exp_avg_sq"] = self._new(value.shape, group.dtype)
                    step = lib.ggml_opt_step_adamw(self.ctx, w, g, m, v, hp_tensor)
                else:
                    step = lib.ggml_opt_step_sgd(self.ctx, w, g, hp_tensor)
                lib.ggml_build_forward_expand(graph, step)
        self.names = [name for g in groups for name in g.init] if adam else []
        self.graph = graph
        self.cplan = lib.ggml_graph_plan(graph, n_threads, None)
        self.work = np.zeros(max(1, self.cplan.work_size), np.uint8)
        if self.cplan.work_size:
            self.cplan.work_data = self.work.ctypes.data

    def _new(self, shape, dtype: str):
        """A new tensor of numpy `shape` and `dtype` (zeros) and a numpy view of its data."""
        if dtype not in TENSOR_TYPES:
            raise ValueError(f"ggml has no {dtype} tensors")
        ne = tuple(int(d) for d in reversed(shape)) + (1,) * (ggml.MAX_DIMS - len(shape))
        if len(ne) > ggml.MAX_DIMS:
            raise ValueError(f"ggml tensors have at most {ggml.MAX_DIMS} dimensions, got "
                             f"shape {list(shape)}")
        t = self.lib.ggml_new_tensor(self.ctx, TENSOR_TYPES[dtype], ggml.MAX_DIMS,
                                     (ctypes.c_int64 * ggml.MAX_DIMS)(*ne))
        nbytes = self.lib.ggml_nbytes(t)
        raw = (ctypes.c_char * nbytes).from_address(self.lib.ggml_get_data(t))
        view = np.frombuffer(raw, np.uint8).view(DTYPES[dtype]).reshape(shape)
        view[...] = 0
        return t, view

    def step(self, grads: dict) -> None:
        self.t += 1
        for name, view in self.grads.items():
            g = np.asarray(grads[name])
            if g.shape != view.shape:
                raise ValueError(f"gradient of {name} has shape {g.shape}, the parameter "
                                 f"{view.shape}")
            view[...] = g
        for hp, view in self.groups:
            view[...] = self.fill(self.optimizer, hp, self.t)
        status = self.lib.ggml_graph_compute(self.graph, ctypes.byref(self.cplan))
        if status != ggml.GGML_STATUS_SUCCESS:
            raise RuntimeError(f"ggml_graph_compute returned status {status}")

    def snapshot(self) -> dict:
        snap = {name: view.copy() for name, view in self.tensors.items()}
        snap.update({f"{name}.step": np.array([float(self.t)]) for name in self.names})
        return snap

    def save(self) -> dict:
        return {"t": self.t, "tensors": {k: v.copy() for k, v in self.tensors.items()}}

    def restore(self, saved: dict) -> None:
        if set(saved["tensors"]) != set(self.tensors):
            raise ValueError(f"saved tensors {sorted(saved['tensors'])} are not this "
                             f"stepper's {sorted(self.tensors)}")
        for k, view in self.tensors.items():
            view[...] = saved["tensors"][k]
        self.t = int(saved["t"])

    def free(self) -> None:
        if self.ctx:
            self.lib.ggml_free(self.ctx)
            self.ctx = None


class _WorkerStepper:
    """A stepper in the adapter's worker process, by key: each method is a call there."""

    def __init__(self, adapter: GgmlOptimizer, key: int):
        self._call, self.key = adapter.call, key
        finalizer = weakref.finalize(self, adapter.dropped.append, key)
        finalizer.atexit = False

    def step(self, grads: dict) -> None:
        self._call("worker_call", self.key, "step", grads)

    def snapshot(self) -> dict:
        return self._call("worker_call", self.key, "snapshot")

    def save(self) -> dict:
        return self._call("worker_call", self.key, "save")

    def restore(self, saved: dict) -> None:
        self._call("worker_call", self.key, "restore", saved)


class GgmlOptimizer:
    """ggml's AdamW and SGD steps (module doc). lib_dir: a directory holding libggml-base.so
    and libggml-cpu.so (None: those of the libggml-python wheel); n_threads: ggml's compute
    threads. AdapterError when the libraries do not load."""

    name = "ggml"
    isolated = True

    def __init__(self, lib_dir: str | None = None, n_threads: int = 1):
        if int(n_threads) < 1:
            raise ValueError(f"n_threads must be >= 1, got {n_threads}")
        self.lib = ggml.load(lib_dir)
        self.n_threads = int(n_threads)
        options = {"lib_dir": self.lib.directory} if lib_dir is not None else {}
        if self.n_threads != 1:
            options["n_threads"] = self.n_threads
        cls = type(self)
        name = self.name if cls is GgmlOptimizer else f"{cls.__module__}:{cls.__qualname__}"
        self.spec = AdapterSpec.of(name, options, MAKER)
        self.worker: Worker | None = None
        self.dropped: list[int] = []     # keys of proxies gone: freed in the worker
        self._keys = itertools.count(1)
        self._open: dict[int, _Stepper] = {}     # in the worker: key -> stepper

    def describe(self) -> str:
        threads = f"{self.n_threads} thread" + ("s" if self.n_threads > 1 else "")
        return (f"ggml {self.lib.version} (commit {self.lib.commit}, {self.lib.directory}): "
                f"ggml_opt_step_adamw and ggml_opt_step_sgd, {threads}, in a worker process")

    def unsupported(self, optimizer, dtype, hp, flags) -> str | None:
        return dtype_refused(optimizer, dtype) or refused(optimizer, hp, flags)

    def step_params(self, optimizer: str, hp: dict, t: int) -> list:
        """The hyperparameter tensor's values for step t (module function step_params)."""
        return step_params(optimizer, hp, t)

    def stepper(self, optimizer, init, hp, flags, dtype):
        return self.grouped_stepper(optimizer, [Group(init, hp, flags, dtype)])

    def grouped_stepper(self, optimizer, groups):
        """One graph over every group's parameters, each group its own hyperparameter
        tensor. Settings ggml has no counterpart for raise ValueError; a dtype ggml has
        tensors for is handed to its kernel, which decides (f16 and bf16 abort)."""
        names = [name for g in groups for name in g.init]
        if len(set(names)) != len(names):
            raise ValueError(f"parameter names repeat across the groups: {names}")
        for g in groups:
            reason = refused(optimizer, g.hp, g.flags)
            if reason or g.dtype not in TENSOR_TYPES:
                raise ValueError(reason or dtype_refused(optimizer, g.dtype))
            for name, value in g.init.items():
                if np.ndim(value) > ggml.MAX_DIMS:
                    raise ValueError(f"ggml tensors have at most {ggml.MAX_DIMS} dimensions; "
                                     f"{name} has shape {list(np.shape(value))}")
        groups = [Group({k: np.asarray(v) for k, v in g.init.items()}, dict(g.hp),
                        dict(g.flags), g.dtype) for g in groups]
        key, dropped = next(self._keys), self.dropped[:]
        del self.dropped[:len(dropped)]
        self.call("worker_open", key, optimizer, groups, dropped)
        return _WorkerStepper(self, key)

    # --- the worker process -----------------------------------------------------------
    def call(self, method: str, *args):
        """self.method(*args) in the worker process, started when none is alive (WorkerCrash
        when it dies or hangs there)."""
        if self.worker is None:
            self.worker = Worker(self.spec)
            self._close = weakref.finalize(self, self.worker.close)
        return self.worker.call(method, *args)

    def worker_open(self, key: int, optimizer: str, groups: list, dropped: list) -> None:
        """In the worker: make stepper `key`; free those of `dropped`."""
        for k in dropped:
            gone = self._open.pop(k, None)
            if gone is not None:
                gone.free()
        self._open[key] = _Stepper(self, optimizer, groups)

    def worker_call(self, key: int, method: str, *args):
        """In the worker: stepper `key`'s `method` (one of STEPPER_METHODS)."""
        if method not in STEPPER_METHODS:
            raise ValueError(f"a stepper has no method {method!r}")
        stepper = self._open.get(key)
        if stepper is None:
            raise LookupError(f"ggml stepper {key} is not in this worker process (freed, "
                              f"or the process was restarted after a crash)")
        return getattr(stepper, method)(*args)

    def close(self) -> None:
        """Stop the worker process (a later stepper starts a fresh one)."""
        if self.worker is not None:
            self._close()
            self.worker = None

    def __enter__(self) -> GgmlOptimizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
