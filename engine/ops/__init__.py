"""The engine's ops. Importing this package registers every op module in the registry."""

from engine.ops.binary import add, div, mul, sub
from engine.ops.reduce import mean, sum
from engine.ops.shape import broadcast_to, cont, cont_if_strided, permute, reshape, transpose
from engine.ops.unary import abs, exp, log, neg, relu, scale, sgn, sqr, sqrt, step

__all__ = ["abs", "add", "broadcast_to", "cont", "cont_if_strided", "div", "exp", "log",
           "mean", "mul", "neg", "permute", "relu", "reshape", "scale", "sgn", "sqr", "sqrt",
           "step", "sub", "sum", "transpose"]
