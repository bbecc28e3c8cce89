"""ggml's own MNIST training, through its C API: the engine column `ggml` of `mnist-regress`.

    run = train_ggml(model, images, labels, config, batch_orders(len(images), config),
                     threads=2)                 # run.history, run.weights, run.interrupted
    acc, acc_unc, used = evaluate_ggml(model.arch, run.weights, test_images, test_labels,
                                       config, threads=2)

This drives ggml-opt (ggml 0.20's `ggml-opt.h`), as ggml's MNIST example does, with the
libraries the gradcheck adapter loads (checkkit.ggml: the `libggml-python`
wheel, or `--ggml-lib DIR`):
- the model's weights in a static context allocated on the CPU backend, flagged with
  ggml_set_param; the forward graph (ggml's mnist_model_build: mul_mat + add + relu for the
  FC; conv_2d, pool_2d, permute and cont for the CNN) in a compute context;
- ggml_opt_init with static graphs: ggml-opt builds the forward graph, the gradient graph
  with accumulation and the optimizer graph (ggml_opt_step_adamw per param), and hands
  each to ggml_backend_sched to allocate;
- one ggml_opt_epoch per epoch: training batches (gradient accumulation over
  batch_logical / batch_physical, then one AdamW step) and then the validation batches
  through the forward graph, on the same opt context. The scheduler allocates the forward
  and the optimizer graph in turn every epoch: the code path where ggml once validated with
  the training graph.

What is ours, not ggml's example: the initial weights (copied in, the same as the engine's
and torch's), the batch order (each epoch's order, from mnist_target.run.batch_orders, is
written into the ggml dataset before the epoch instead of ggml_opt_dataset_shuffle) and the
AdamW settings (ggml_opt_get_constant_optimizer_params over our values; ggml's default
callback has the same ones). ggml aborts the process on a failed assertion, so every size it
asserts on is checked here first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import time
from ctypes import (
    byref,
    c_bool,
    c_double,
    c_int64,
    c_void_p,
)

import numpy as np

from checkkit.ggml import (
    BUILD_FORWARD,
    BUILD_OPT,
    GGML_OP_POOL_MAX,
    GGML_TYPE_F32,
    GRAPH_SIZE,
    LOSS_CROSS_ENTROPY,
    OPTIMIZER_ADAMW,
    OptimizerParams,
    OptParams,
    load_training,
)
from engine.errors import EngineError
from engine.train import EpochResult
from mnist_target.models import CNN_CHANNELS, HW, NCLASSES, NINPUT, SHAPES, arch_name
from mnist_target.run import EpochRecord, TrainConfig

P = c_void_p


def load_training_lib(lib_dir: str | None = None):
    """ggml's libraries with the training API declared (checkkit.ggml.load_training);
    an EngineError here when they are missing or of another version."""
    from checkkit.loading import AdapterError
    try:
        return load_training(lib_dir)
    except AdapterError as exc:
        raise EngineError(str(exc)) from None


def _ne(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(shape))


class GgmlModel:
    """One MNIST model in ggml: the CPU backend and its scheduler, the weights and the
    images input (static context, on the backend), the forward graph (compute context).
    Use as a context manager: everything is freed on exit."""

    def __init__(self, lib, arch: str, weights: dict[str, np.ndarray], batch: int,
                 threads: int):
        self.lib, self.arch, self.batch, self.threads = lib, arch_name(arch), batch, threads
        self.initial = {name: np.ascontiguousarray(weights[name], np.float32)
                        for name in SHAPES[self.arch]}
        self._handles: list[tuple] = []

    def __enter__(self) -> GgmlModel:
        lib = self.lib
        from checkkit.ggml import InitParams
        try:
            self.backend = self._own(lib.ggml_backend_cpu_init(), lib.ggml_backend_free,
                                     "ggml_backend_cpu_init")
            lib.ggml_backend_cpu_set_n_threads(self.backend, self.threads)
            backends = (P * 1)(self.backend)
            self.sched = self._own(
                lib.ggml_backend_sched_new(backends, None, 1, GRAPH_SIZE, False, True),
                lib.ggml_backend_sched_free, "ggml_backend_sched_new")
            overhead = lib.ggml_tensor_overhead()
            self.ctx_static = self._own(lib.ggml_init(InitParams(64 * overhead, None, True)),
                                        lib.ggml_free, "ggml_init (static context)")
            self.params = {}
            for name, value in self.initial.items():
                t = self._new(self.ctx_static, value.shape)
                lib.ggml_set_name(t, name.encode())
                self.params[name] = t
            self.images = self._new(self.ctx_static, (self.batch, NINPUT))
            lib.ggml_set_name(self.images, b"images")
            lib.ggml_set_input(self.images)
            self._own(lib.ggml_backend_alloc_ctx_tensors(self.ctx_static, self.backend),
                      lib.ggml_backend_buffer_free, "ggml_backend_alloc_ctx_tensors")
            for name, value in self.initial.items():
                lib.ggml_backend_tensor_set(self.params[name], value.ctypes.data, 0,
                                            value.nbytes)
            size = GRAPH_SIZE * overhead + 3 * lib.ggml_graph_overhead()
            self.ctx_compute = self._own(lib.ggml_init(InitParams(size, None, True)),
                                         lib.ggml_free, "ggml_init (compute context)")
            self.logits = self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        while self._handles:
            handle, free = self._handles.pop()
            free(handle)

    def _own(self, handle, free, what: str):
        if not handle:
            raise EngineError(f"ggml: {what} failed")
        self._handles.append((handle, free))
        return handle

    def _new(self, ctx, shape):
        ne = (c_int64 * 4)(*(_ne(shape) + (1,) * (4 - len(shape))))
        return self.lib.ggml_new_tensor(ctx, GGML_TYPE_F32, len(shape), ne)

    def _build(self):
        """ggml's mnist_model_build on the compute context; returns the logits."""
        lib, ctx, w = self.lib, self.ctx_compute, self.params
        for t in w.values():
            lib.ggml_set_param(t)
        if self.arch == "mnist-fc":
            hidden = lib.ggml_relu(ctx, lib.ggml_add(
                ctx, lib.ggml_mul_mat(ctx, w["fc1.weight"], self.images), w["fc1.bias"]))
            logits = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, w["fc2.weight"], hidden),
                                  w["fc2.bias"])
        else:
            x = lib.ggml_reshape_4d(ctx, self.images, HW, HW, 1, self.batch)
            for conv in ("conv1", "conv2"):
                x = lib.ggml_conv_2d(ctx, w[f"{conv}.kernel"], x, 1, 1, 1, 1, 1, 1)
                x = lib.ggml_relu(ctx, lib.ggml_add(ctx, x, w[f"{conv}.bias"]))
                x = lib.ggml_pool_2d(ctx, x, GGML_OP_POOL_MAX, 2, 2, 2, 2, 0.0, 0.0)
            x = lib.ggml_cont(ctx, lib.ggml_permute(ctx, x, 1, 2, 0, 3))
            x = lib.ggml_reshape_2d(ctx, x, (HW // 4) ** 2 * 2 * CNN_CHANNELS, self.batch)
            logits = lib.ggml_add(ctx, lib.ggml_mul_mat(ctx, w["dense.weight"], x),
                                  w["dense.bias"])
        lib.ggml_set_name(logits, b"logits")
        lib.ggml_set_output(logits)
        if tuple(lib.tensor(logits).ne) != (NCLASSES, self.batch, 1, 1):
            raise EngineError(f"ggml: the {self.arch} logits have ne "
                              f"{list(lib.tensor(logits).ne)}, not [10, {self.batch}, 1, 1]")
        return logits

    def weights(self) -> dict[str, np.ndarray]:
        """The current weights, read back from the backend, in the model's shapes."""
        out = {}
        for name, value in self.initial.items():
            array = np.empty_like(value)
            self.lib.ggml_backend_tensor_get(self.params[name], array.ctypes.data, 0,
                                             array.nbytes)
            out[name] = array
        return out

    def opt_context(self, build_type: int, opt_period: int = 1,
                    optimizer_params: OptimizerParams | None = None):
        """A ggml_opt context over this model (cross-entropy loss, static graphs); the
        caller frees it with ggml_opt_free. `optimizer_params` must outlive it."""
        lib = self.lib
        params = lib.ggml_opt_default_params(self.sched, LOSS_CROSS_ENTROPY)
        _check_default_params(lib, params, self.sched)
        params.ctx_compute, params.inputs, params.outputs = (self.ctx_compute, self.images,
                                                             self.logits)
        params.build_type, params.opt_period = build_type, opt_period
        params.optimizer = OPTIMIZER_ADAMW
        if optimizer_params is not None:
            params.get_opt_pars = lib.address(
                "libggml-base.so", "ggml_opt_get_constant_optimizer_params")
            params.get_opt_pars_ud = ctypes.addressof(optimizer_params)
        opt = lib.ggml_opt_init(params)
        if not opt:
            raise EngineError("ggml: ggml_opt_init failed")
        return opt


def _check_default_params(lib, params: OptParams, sched) -> None:
    """ggml_opt_default_params came back as the layout OptParams mirrors (ggml 0.20)."""
    ok = (params.backend_sched == sched and not params.ctx_compute and not params.inputs
          and params.loss_type == LOSS_CROSS_ENTROPY and params.build_type == BUILD_OPT
          and params.opt_period == 1 and params.optimizer == OPTIMIZER_ADAMW
          and params.get_opt_pars == lib.address("libggml-base.so",
                                                 "ggml_opt_get_default_optimizer_params"))
    if not ok:
        raise EngineError(f"ggml: struct ggml_opt_params in {lib.directory} (ggml "
                          f"{lib.version}) does not have the layout of ggml 0.20's ggml-opt.h")


class _Dataset:
    """A ggml_opt dataset of `n` images (784 floats) and one-hot labels (10 floats)."""

    def __init__(self, lib, n: int):
        self.lib, self.n = lib, n
        self.handle = lib.ggml_opt_dataset_init(GGML_TYPE_F32, GGML_TYPE_F32, NINPUT,
                                                NCLASSES, n, 1)
        if not self.handle:
            raise EngineError(f"ggml: ggml_opt_dataset_init failed for {n} images")

    def fill(self, images: np.ndarray, labels: np.ndarray) -> None:
        images = np.ascontiguousarray(images, np.float32)
        onehot = np.zeros((len(labels), NCLASSES), np.float32)
        onehot[np.arange(len(labels)), np.asarray(labels, np.int64)] = 1.0
        lib = self.lib
        lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_data(self.handle),
                                    images.ctypes.data, 0, images.nbytes)
        lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_labels(self.handle),
                                    onehot.ctypes.data, 0, onehot.nbytes)

    def free(self) -> None:
        self.lib.ggml_opt_dataset_free(self.handle)


def _result_of(lib, result) -> EpochResult:
    """A ggml_opt result as an engine.train.EpochResult summary (its loss and accuracy
    with ggml's own uncertainties)."""
    loss, loss_unc, acc, acc_unc = c_double(), c_double(), c_double(), c_double()
    ndata = c_int64()
    lib.ggml_opt_result_loss(result, byref(loss), byref(loss_unc))
    lib.ggml_opt_result_accuracy(result, byref(acc), byref(acc_unc))
    lib.ggml_opt_result_ndata(result, byref(ndata))
    return _Summary(loss.value, loss_unc.value, acc.value, acc_unc.value, ndata.value)


class _Summary(EpochResult):
    """An EpochResult whose loss and accuracy come from ggml's result."""

    def __init__(self, loss, loss_unc, acc, acc_unc, ndata):
        super().__init__("cross_entropy")
        self._loss, self._acc, self.ndata = (loss, loss_unc), (acc, acc_unc), ndata

    def loss(self):
        return self._loss if self.ndata else (float("nan"), float("nan"))

    def accuracy(self):
        return self._acc if self.ndata else (float("nan"), float("nan"))


def _check_sizes(config: TrainConfig, n: int) -> tuple[int, int]:
    """(datapoints used, training datapoints) as ggml_opt_epoch asserts them; EngineError
    where ggml would abort."""
    config.validate(n)
    used = n // config.batch_physical * config.batch_physical
    split = config.training_split(n)
    return used, split


# ggml_opt_epoch_callback: (train, opt_ctx, dataset, result, ibatch, ibatch_max, t_start_us)
EPOCH_CALLBACK = ctypes.CFUNCTYPE(None, c_bool, c_void_p, c_void_p, c_void_p, c_int64,
                                  c_int64, c_int64)


class _Progress:
    """ggml_opt_epoch's callback for one epoch: a tqdm bar over its physical batches (when
    enabled) with the running loss and accuracy, and Ctrl-C caught where it lands (inside
    the callback, Python code that ggml calls) to stop after the epoch."""

    def __init__(self, lib, enabled: bool, batch: int):
        self.lib, self.enabled, self.batch = lib, enabled, batch
        self.bar, self.interrupted = None, False
        self.callback = EPOCH_CALLBACK(self._tick)

    def start(self, epoch: int, epochs: int, nbatches: int) -> None:
        if self.enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=nbatches * self.batch, desc=f"ggml epoch {epoch}/{epochs}",
                            unit="img", unit_scale=True, leave=False, dynamic_ncols=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _tick(self, train, _opt, _dataset, result, _ibatch, _ibatch_max, _t_start):
        try:
            if self.bar is not None:
                summary = _result_of(self.lib, result)
                self.bar.set_postfix_str(f"{'train' if train else 'val'} loss "
                                         f"{summary.loss()[0]:.4f} acc "
                                         f"{100 * summary.accuracy()[0]:.2f}%", refresh=False)
                self.bar.update(self.batch)
        except KeyboardInterrupt:
            self.interrupted = True


@dataclasses.dataclass
class GgmlRun:
    """ggml's training run: one record per completed epoch, the weights after the last."""

    history: list[EpochRecord]
    weights: dict[str, np.ndarray]
    interrupted: bool = False


def train_ggml(model, images: np.ndarray, labels: np.ndarray, config: TrainConfig,
               orders: list[np.ndarray], threads: int, lib_dir: str | None = None,
               progress: bool = False, on_epoch=None) -> GgmlRun:
    """Train `model`'s architecture in ggml from `model.weights()` on `images` (n, 784) and
    int `labels`, epoch e in the datapoint order orders[e] (mnist_target.run.batch_orders).
    The records are ggml's own results (mean loss per physical batch, accuracy); `model` is
    left as it was. progress: a tqdm bar per epoch. Ctrl-C stops after the epoch it lands
    in (ggml runs an epoch in one call) and the run is marked interrupted."""
    lib = load_training_lib(lib_dir)
    used, split = _check_sizes(config, len(images))
    hp = OptimizerParams(config.lr, 0.9, 0.999, 1e-8, 0.0, config.lr, 0.0)
    history: list[EpochRecord] = []
    bar = _Progress(lib, progress, config.batch_physical)
    with GgmlModel(lib, model.arch, model.weights(), config.batch_physical, threads) as g:
        opt = g.opt_context(BUILD_OPT, config.batch_logical // config.batch_physical, hp)
        dataset = _Dataset(lib, used)
        train, val = lib.ggml_opt_result_init(), lib.ggml_opt_result_init()
        try:
            for epoch, order in enumerate(orders, start=1):
                try:
                    start = time.perf_counter()
                    order = np.asarray(order)[:used]
                    dataset.fill(images[order], np.asarray(labels)[order])
                    lib.ggml_opt_result_reset(train)
                    lib.ggml_opt_result_reset(val)
                    bar.start(epoch, len(orders), used // config.batch_physical)
                    lib.ggml_opt_epoch(opt, dataset.handle, train, val, split, bar.callback,
                                       bar.callback)
                    bar.close()
                    history.append(EpochRecord.from_results(
                        epoch, _result_of(lib, train), _result_of(lib, val),
                        time.perf_counter() - start))
                    if on_epoch is not None:
                        on_epoch(history[-1])
                except KeyboardInterrupt:
                    bar.interrupted = True
                if bar.interrupted:
                    break
            weights = g.weights()
        finally:
            bar.close()
            lib.ggml_opt_result_free(train)
            lib.ggml_opt_result_free(val)
            dataset.free()
            lib.ggml_opt_free(opt)
    return GgmlRun(history, weights, bar.interrupted)


def evaluate_ggml(arch: str, weights: dict[str, np.ndarray], images: np.ndarray,
                  labels: np.ndarray, config: TrainConfig, threads: int,
                  lib_dir: str | None = None) -> tuple[float, float, int]:
    """(accuracy, its standard error, images used) of `weights` in ggml on a labelled set,
    as ggml's mnist_model_eval: a forward-only opt context and one ggml_opt_epoch. ggml
    evaluates whole batches only, so the last len(images) % batch_physical are left out."""
    lib = load_training_lib(lib_dir)
    used = len(images) // config.batch_physical * config.batch_physical
    if used == 0:
        raise EngineError(f"ggml evaluates whole batches of {config.batch_physical}; "
                          f"{len(images)} test images hold none")
    with GgmlModel(lib, arch, weights, config.batch_physical, threads) as g:
        opt = g.opt_context(BUILD_FORWARD)
        dataset = _Dataset(lib, used)
        result = lib.ggml_opt_result_init()
        try:
            dataset.fill(images[:used], np.asarray(labels)[:used])
            lib.ggml_opt_epoch(opt, dataset.handle, None, result, 0, None, None)
            acc, acc_unc = _result_of(lib, result).accuracy()
        finally:
            lib.ggml_opt_result_free(result)
            dataset.free()
            lib.ggml_opt_free(opt)
    return acc, acc_unc, used
