"""Loading ggml's CPU libraries through ctypes, against ggml 0.20's C API.

The libraries come from the PyPI wheel `libggml-python` (package `libggml`, directory
`lib64/`) or from a user's own build directory holding libggml-base.so and libggml-cpu.so.
libggml-base (tensors, graphs, autodiff) is loaded first with RTLD_GLOBAL, so that
libggml-cpu (the kernels and ggml_graph_compute) resolves its symbols against it.

Every function the adapter calls is declared in SIGNATURES with its C argument and return
types. Loading checks, in this order, and raises AdapterError naming the offender:
the directory and both library files exist and load; every symbol is present; ggml_version()
is a release this adapter was written for (SUPPORTED); `struct ggml_tensor` has the layout
mirrored by GgmlTensor (its `ne`, `nb`, `data` and `name` fields are probed on a tensor
made through the API and compared with what the accessors report).

A failed GGML_ASSERT calls ggml_abort, which by default forks the process to attach gdb for
a backtrace; when several compute threads fail at once those forks deadlock, and a single
one takes seconds. Loading sets GGML_NO_BACKTRACE=1 (unless it is set already), so an
assertion prints its message and aborts at once.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from ctypes import (
    POINTER,
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_void_p,
)

from checkkit.loading import AdapterError

SUPPORTED = ((0, 20),)          # ggml major.minor releases whose C API this adapter matches
BASE, CPU = "libggml-base.so", "libggml-cpu.so"
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_I32, GGML_TYPE_BF16 = 0, 1, 26, 30   # enum ggml_type
GGML_OP_POOL_MAX, GGML_OP_POOL_AVG = 0, 1   # enum ggml_op_pool
GGML_STATUS_SUCCESS = 0
MAX_DIMS = 4


class InitParams(ctypes.Structure):
    """struct ggml_init_params, passed by value to ggml_init."""
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor as declared in ggml.h (0.20); the adapter reads ne, nb and data."""
    _fields_ = [("type", c_int), ("buffer", c_void_p),
                ("ne", c_int64 * MAX_DIMS), ("nb", c_size_t * MAX_DIMS),
                ("op", c_int), ("op_params", c_int32 * 16), ("flags", c_int32),
                ("src", c_void_p * 10), ("view_src", c_void_p), ("view_offs", c_size_t),
                ("data", c_void_p), ("name", c_char * 64), ("extra", c_void_p),
                ("padding", c_char * 8)]


class Cplan(ctypes.Structure):
    """struct ggml_cplan (ggml-cpu.h): ggml_graph_plan returns it by value; the caller sets
    work_data to a buffer of work_size bytes (or NULL when 0) before ggml_graph_compute, so a
    graph computed again and again needs no context memory per compute (as
    ggml_graph_compute_with_ctx takes)."""
    _fields_ = [("work_size", c_size_t), ("work_data", c_void_p), ("n_threads", c_int),
                ("threadpool", c_void_p), ("abort_callback", c_void_p),
                ("abort_callback_data", c_void_p), ("use_ref", c_bool)]


P, I64 = c_void_p, c_int64
_UNARY = ("sqr", "sqrt", "log", "sin", "cos", "abs", "sgn", "neg", "step", "relu", "silu",
          "exp", "expm1", "softplus", "gelu_quick", "sum", "sum_rows", "mean", "cont",
          "transpose", "dup")
# the GLU family: fused (one input split in halves), its swapped variant, and split (two)
GLU = ("swiglu", "geglu", "geglu_erf", "geglu_quick", "reglu")
# library -> {function: (restype, argtypes)}; pointers to ggml structs are opaque c_void_p
SIGNATURES: dict[str, dict[str, tuple]] = {
    BASE: {
        "ggml_version": (c_char_p, []),
        "ggml_commit": (c_char_p, []),
        "ggml_init": (P, [InitParams]),
        "ggml_free": (None, [P]),
        "ggml_tensor_overhead": (c_size_t, []),
        "ggml_graph_overhead_custom": (c_size_t, [c_size_t, c_bool]),
        "ggml_new_tensor": (P, [P, c_int, c_int, POINTER(c_int64)]),
        "ggml_get_data": (c_void_p, [P]),
        "ggml_get_name": (c_void_p, [P]),
        "ggml_set_name": (P, [P, c_char_p]),
        "ggml_nbytes": (c_size_t, [P]),
        "ggml_nelements": (c_int64, [P]),
        "ggml_is_contiguous": (c_bool, [P]),
        "ggml_set_param": (None, [P]),
        "ggml_set_output": (None, [P]),
        "ggml_set_loss": (None, [P]),
        "ggml_new_graph_custom": (P, [P, c_size_t, c_bool]),
        "ggml_build_forward_expand": (None, [P, P]),
        "ggml_build_backward_expand": (None, [P, P, P]),
        "ggml_graph_reset": (None, [P]),
        "ggml_graph_get_grad": (P, [P, P]),
        **{f"ggml_{name}": (P, [P, P]) for name in _UNARY},
        **{f"ggml_{name}": (P, [P, P, P]) for name in ("add", "sub", "mul", "div", "mul_mat",
                                                      "get_rows", "repeat_back",
                                                      "cross_entropy_loss")},
        **{f"ggml_{name}{form}": (P, [P, P]) for name in GLU for form in ("", "_swapped")},
        **{f"ggml_{name}_split": (P, [P, P, P]) for name in GLU},
        **{f"ggml_{name}": (P, [P, P, P]) for name in ("add1", "out_prod")},
        "ggml_soft_max_add_sinks": (None, [P, P]),
        **{f"ggml_diag_mask_{name}": (P, [P, P, c_int]) for name in ("inf", "zero")},
        "ggml_win_part": (P, [P, P, c_int]),
        "ggml_win_unpart": (P, [P, P, c_int, c_int, c_int]),
        "ggml_rope_ext": (P, [P, P, P, P, c_int, c_int, c_int, c_float, c_float, c_float,
                              c_float, c_float, c_float]),
        "ggml_cast": (P, [P, P, c_int]),
        "ggml_scale": (P, [P, P, c_float]),
        "ggml_rms_norm": (P, [P, P, c_float]),
        "ggml_soft_max_ext": (P, [P, P, P, c_float, c_float]),
        "ggml_repeat_4d": (P, [P, P, I64, I64, I64, I64]),
        "ggml_reshape_1d": (P, [P, P, I64]),
        "ggml_reshape_4d": (P, [P, P, I64, I64, I64, I64]),
        "ggml_permute": (P, [P, P, c_int, c_int, c_int, c_int]),
        "ggml_view_4d": (P, [P, P, I64, I64, I64, I64, c_size_t, c_size_t, c_size_t,
                             c_size_t]),
        "ggml_acc": (P, [P, P, P, c_size_t, c_size_t, c_size_t, c_size_t]),
        "ggml_set": (P, [P, P, P, c_size_t, c_size_t, c_size_t, c_size_t]),
        "ggml_im2col": (P, [P, P, P, c_int, c_int, c_int, c_int, c_int, c_int, c_bool,
                            c_int]),
        "ggml_conv_2d": (P, [P, P, P, c_int, c_int, c_int, c_int, c_int, c_int]),
        "ggml_pool_2d": (P, [P, P, c_int, c_int, c_int, c_int, c_int, c_float, c_float]),
        # the optimizer steps (optcheck's ggml adapter): a, grad, m, v, adamw_params (7 f32:
        # alpha, beta1, beta2, eps, wd, beta1h, beta2h); a, grad, sgd_params (2 f32: alpha,
        # wd). `a` must be a param; the result is `a` updated in place
        "ggml_opt_step_adamw": (P, [P, P, P, P, P, P]),
        "ggml_opt_step_sgd": (P, [P, P, P, P]),
    },
    CPU: {
        "ggml_cpu_init": (None, []),
        "ggml_graph_compute_with_ctx": (c_int, [P, P, c_int]),
        "ggml_graph_plan": (Cplan, [P, c_int, P]),
        "ggml_graph_compute": (c_int, [P, POINTER(Cplan)]),
    },
}


class GgmlLib:
    """ggml's C functions as attributes (`lib.ggml_add(ctx, a, b)`), with the version,
    commit and directory they were loaded from."""

    def __init__(self, directory: str, handles: dict[str, ctypes.CDLL]):
        self.directory = directory
        self.handles = handles
        self.declare(SIGNATURES)
        self.version = self.ggml_version().decode()
        self.commit = self.ggml_commit().decode()

    def declare(self, signatures: dict[str, dict[str, tuple]]) -> None:
        """Declare more functions ({library: {function: (restype, argtypes)}}, as
        SIGNATURES) and make them attributes; AdapterError naming a missing symbol."""
        for libname, functions in signatures.items():
            for fn, (restype, argtypes) in functions.items():
                try:
                    f = getattr(self.handles[libname], fn)
                except AttributeError:
                    raise AdapterError(
                        f"ggml: {os.path.join(self.directory, libname)} lacks the symbol "
                        f"{fn}; is it ggml {_supported_text()}?") from None
                f.restype, f.argtypes = restype, argtypes
                setattr(self, fn, f)

    def address(self, libname: str, fn: str) -> int:
        """The address of function `fn` of `libname` (BASE or CPU), to pass as a C function
        pointer."""
        return ctypes.cast(getattr(self.handles[libname], fn), c_void_p).value

    def tensor(self, ptr) -> GgmlTensor:
        """The struct behind a tensor pointer (read its ne, nb; never write it)."""
        return GgmlTensor.from_address(ptr)


def _supported_text() -> str:
    return " or ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED)


def wheel_directory() -> str:
    """The libraries' directory inside the installed `libggml` package (not imported)."""
    spec = importlib.util.find_spec("libggml")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterError("ggml: the package libggml is not installed (pip install "
                           "'libggml-python>=0.20,<0.21'), and no library directory was given "
                           "(--ggml-lib DIR)")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib64")


def check_version(version: str, directory: str) -> None:
    """Raise AdapterError unless `version` (ggml_version()) is a SUPPORTED release."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        raise AdapterError(f"ggml: cannot read the version {version!r} reported by the "
                           f"libraries in {directory}") from None
    if (major, minor) not in SUPPORTED:
        raise AdapterError(f"ggml: the libraries in {directory} are ggml {version}; this "
                           f"adapter is written against the C API of ggml {_supported_text()}")


def _open(path: str) -> ctypes.CDLL:
    if not os.path.isfile(path):
        raise AdapterError(f"ggml: library {path} not found")
    try:
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise AdapterError(f"ggml: cannot load {path}: {exc}") from None


def _check_layout(lib: GgmlLib) -> None:
    """Probe struct ggml_tensor's fields on a [5, 3, 2] f32 tensor against the accessors."""
    ctx = lib.ggml_init(InitParams(1 << 16, None, False))
    if not ctx:
        raise AdapterError("ggml: ggml_init failed for a 64 KiB context")
    try:
        ne = (c_int64 * MAX_DIMS)(5, 3, 2, 1)
        t = lib.ggml_new_tensor(ctx, GGML_TYPE_F32, 3, ne)
        lib.ggml_set_name(t, b"probe")
        s = lib.tensor(t)
        ok = (list(s.ne) == [5, 3, 2, 1] and list(s.nb) == [4, 20, 60, 120]
              and s.data == lib.ggml_get_data(t)
              and ctypes.addressof(s) + GgmlTensor.name.offset == lib.ggml_get_name(t)
              and lib.ggml_nbytes(t) == 120)
    finally:
        lib.ggml_free(ctx)
    if not ok:
        raise AdapterError(f"ggml: struct ggml_tensor in {lib.directory} (ggml {lib.version}) "
                           "does not have the layout of ggml 0.20's ggml.h")


_LOADED: dict[str, GgmlLib] = {}


def _not_a_directory(lib_dir: str | None, directory: str) -> str:
    """Why `directory` (lib_dir resolved) is no library directory: what it is instead."""
    what = f"--ggml-lib {lib_dir}" if lib_dir is not None else f"the libggml wheel's {directory}"
    expected = f"a directory holding {BASE} and {CPU}"
    if not os.path.exists(directory):
        return f"ggml: {what} does not exist (expected {expected})"
    if not os.path.isfile(directory):
        return f"ggml: {what} is not a directory (expected {expected})"
    if os.path.basename(directory) in (BASE, CPU):
        expected = f"the directory that holds it, {os.path.dirname(directory)}"
    return f"ggml: {what} is a file, not a directory (expected {expected})"


def load(lib_dir: str | None = None) -> GgmlLib:
    """ggml's libraries from `lib_dir` (default: the libggml wheel's), loaded once per
    process and directory; AdapterError if missing, incomplete or of another version."""
    directory = os.path.realpath(lib_dir if lib_dir is not None else wheel_directory())
    if directory in _LOADED:
        return _LOADED[directory]
    if not os.path.isdir(directory):
        raise AdapterError(_not_a_directory(lib_dir, directory))
    missing = [name for name in (BASE, CPU) if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise AdapterError(f"ggml: {directory} lacks {' and '.join(missing)} (a ggml build "
                           f"directory holds both {BASE} and {CPU})")
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    handles = {name: _open(os.path.join(directory, name)) for name in (BASE, CPU)}
    version = getattr(handles[BASE], "ggml_version", None)
    if version is None:
        raise AdapterError(f"ggml: {os.path.join(directory, BASE)} lacks the symbol "
                           "ggml_version; is it a ggml library?")
    version.restype, version.argtypes = c_char_p, []
    check_version(version().decode(), directory)
    lib = GgmlLib(directory, handles)
    lib.ggml_cpu_init()
    _check_layout(lib)
    _LOADED[directory] = lib
    return lib


# --- the training API (ggml-opt): MNIST in ggml (mnist_target.ggml_train) ------------------
GRAPH_SIZE = 2048                       # GGML_DEFAULT_GRAPH_SIZE
LOSS_CROSS_ENTROPY = 2                  # enum ggml_opt_loss_type
BUILD_FORWARD, BUILD_OPT = 10, 30       # enum ggml_opt_build_type
OPTIMIZER_ADAMW = 0                     # enum ggml_opt_optimizer_type


class OptimizerParams(ctypes.Structure):
    """struct ggml_opt_optimizer_params: adamw {alpha, beta1, beta2, eps, wd}, sgd {alpha, wd}."""
    _fields_ = [("alpha", c_float), ("beta1", c_float), ("beta2", c_float), ("eps", c_float),
                ("wd", c_float), ("sgd_alpha", c_float), ("sgd_wd", c_float)]


class OptParams(ctypes.Structure):
    """struct ggml_opt_params (passed and returned by value)."""
    _fields_ = [("backend_sched", c_void_p), ("ctx_compute", c_void_p), ("inputs", c_void_p),
                ("outputs", c_void_p), ("loss_type", c_int), ("build_type", c_int),
                ("opt_period", c_int32), ("get_opt_pars", c_void_p),
                ("get_opt_pars_ud", c_void_p), ("optimizer", c_int)]


D = POINTER(c_double)
# the functions of ggml-backend, ggml-alloc and ggml-opt that training calls (ggml 0.20):
# declared by load_training, for the MNIST target's ggml run and optimizer checks
TRAINING_SIGNATURES = {
    BASE: {
        "ggml_graph_overhead": (c_size_t, []),
        "ggml_set_input": (None, [P]),
        "ggml_reshape_2d": (P, [P, P, c_int64, c_int64]),
        "ggml_backend_sched_new": (P, [POINTER(P), P, c_int, c_size_t, c_bool, c_bool]),
        "ggml_backend_sched_free": (None, [P]),
        "ggml_backend_free": (None, [P]),
        "ggml_backend_alloc_ctx_tensors": (P, [P, P]),
        "ggml_backend_buffer_free": (None, [P]),
        "ggml_backend_tensor_set": (None, [P, c_void_p, c_size_t, c_size_t]),
        "ggml_backend_tensor_get": (None, [P, c_void_p, c_size_t, c_size_t]),
        "ggml_opt_default_params": (OptParams, [P, c_int]),
        "ggml_opt_init": (P, [OptParams]),
        "ggml_opt_free": (None, [P]),
        "ggml_opt_dataset_init": (P, [c_int, c_int, c_int64, c_int64, c_int64, c_int64]),
        "ggml_opt_dataset_free": (None, [P]),
        "ggml_opt_dataset_data": (P, [P]),
        "ggml_opt_dataset_labels": (P, [P]),
        "ggml_opt_result_init": (P, []),
        "ggml_opt_result_free": (None, [P]),
        "ggml_opt_result_reset": (None, [P]),
        "ggml_opt_result_loss": (None, [P, D, D]),
        "ggml_opt_result_accuracy": (None, [P, D, D]),
        "ggml_opt_result_ndata": (None, [P, POINTER(c_int64)]),
        "ggml_opt_epoch": (None, [P, P, P, P, c_int64, P, P]),
        "ggml_opt_get_constant_optimizer_params": (OptimizerParams, [P]),
    },
    CPU: {
        "ggml_backend_cpu_init": (P, []),
        "ggml_backend_cpu_set_n_threads": (None, [P, c_int]),
    },
}


def load_training(lib_dir: str | None = None) -> GgmlLib:
    """ggml's libraries (load) with the training API of TRAINING_SIGNATURES declared too;
    AdapterError when they are missing or of another version."""
    lib = load(lib_dir)
    if not hasattr(lib, "ggml_opt_init"):
        lib.declare(TRAINING_SIGNATURES)
    return lib
