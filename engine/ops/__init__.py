"""The engine's ops. Importing this package registers every op module in the registry."""

from engine.ops.argmax import argmax
from engine.ops.binary import add, div, mul, sub
from engine.ops.block import block
from engine.ops.concat import concat
from engine.ops.conv_2d import conv_2d
from engine.ops.conv_transpose_2d import conv_transpose_2d
from engine.ops.cross_entropy import cross_entropy_loss, cross_entropy_loss_back
from engine.ops.dropout import dropout
from engine.ops.get_rows import get_rows, get_rows_back
from engine.ops.im2col import im2col, im2col_back
from engine.ops.im2col_1d import im2col_1d, im2col_1d_back
from engine.ops.matmul import matmul
from engine.ops.mse_loss import mse_loss
from engine.ops.norm import norm, norm_back, rms_norm, rms_norm_back
from engine.ops.optimizer_steps import adam_step, adamw_step, sgd_step
from engine.ops.pad import pad
from engine.ops.pool_1d import pool_1d
from engine.ops.pool_2d import pool_2d, pool_2d_back
from engine.ops.reduce import mean, sum, sum_rows
from engine.ops.repeat import repeat, repeat_back
from engine.ops.set_acc import acc, set
from engine.ops.shape import broadcast_to, cont, cont_if_strided, permute, reshape, transpose
from engine.ops.softmax import log_softmax, softmax, softmax_back
from engine.ops.unary import (
    abs,
    clamp,
    cos,
    elu,
    exp,
    gelu,
    gelu_erf,
    hardswish,
    leaky_relu,
    log,
    neg,
    relu,
    scale,
    sgn,
    sigmoid,
    silu,
    sin,
    softplus,
    sqr,
    sqrt,
    step,
    tanh,
)

__all__ = ["abs", "add", "broadcast_to", "cont", "cont_if_strided", "div", "exp", "log",
           "mean", "mul", "neg", "permute", "relu", "reshape", "scale", "sgn", "sqr", "sqrt",
           "step", "sub", "sum", "transpose"]
__all__ += ["conv_2d", "im2col", "im2col_back", "pool_2d", "pool_2d_back"]
__all__ += ["argmax", "cross_entropy_loss", "cross_entropy_loss_back", "log_softmax",
            "matmul", "softmax", "softmax_back"]
__all__ += ["clamp", "cos", "elu", "gelu", "gelu_erf", "hardswish", "leaky_relu", "sigmoid",
            "silu", "sin", "softplus", "tanh"]
__all__ += ["conv_transpose_2d", "im2col_1d", "im2col_1d_back", "mse_loss", "norm",
            "norm_back", "pool_1d", "rms_norm", "rms_norm_back"]
__all__ += ["acc", "block", "concat", "dropout", "get_rows", "get_rows_back", "pad",
            "repeat", "repeat_back", "set", "sum_rows"]
__all__ += ["adam_step", "adamw_step", "sgd_step"]
