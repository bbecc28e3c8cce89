"""The engine's ops. Importing this package registers every op module in the registry."""

from engine.ops.argmax import argmax
from engine.ops.binary import add, div, mul, sub
from engine.ops.conv_2d import conv_2d
from engine.ops.cross_entropy import cross_entropy_loss, cross_entropy_loss_back
from engine.ops.im2col import im2col, im2col_back
from engine.ops.matmul import matmul
from engine.ops.pool_2d import pool_2d, pool_2d_back
from engine.ops.reduce import mean, sum
from engine.ops.shape import broadcast_to, cont, cont_if_strided, permute, reshape, transpose
from engine.ops.softmax import log_softmax, softmax, softmax_back
from engine.ops.unary import abs, exp, log, neg, relu, scale, sgn, sqr, sqrt, step

__all__ = ["abs", "add", "broadcast_to", "cont", "cont_if_strided", "div", "exp", "log",
           "mean", "mul", "neg", "permute", "relu", "reshape", "scale", "sgn", "sqr", "sqrt",
           "step", "sub", "sum", "transpose"]
__all__ += ["conv_2d", "im2col", "im2col_back", "pool_2d", "pool_2d_back"]
__all__ += ["argmax", "cross_entropy_loss", "cross_entropy_loss_back", "log_softmax",
            "matmul", "softmax", "softmax_back"]
