"""The layout of the optimizers' hyperparameter tensors: which value sits at which position.

An optimizer keeps its numeric hyperparameters in one small float64 tensor `hp` (so that a
schedule changes them without a rebuild); its step op checks the tensor's length, and the
CPU and CUDA kernels read the values by position. All three take the layout from here:

    sgd_step:                hp = [lr, momentum, dampening, weight_decay]
    adam_step, adamw_step:   hp = [lr, beta1, beta2, eps, weight_decay]

The positions are also given as module-level integers (SGD_LR, ADAM_BETA1, ...), which
numba kernels read as compile-time constants.
"""

from __future__ import annotations

SGD_HPARAMS = ("lr", "momentum", "dampening", "weight_decay")
SGD_LR, SGD_MOMENTUM, SGD_DAMPENING, SGD_WEIGHT_DECAY = range(len(SGD_HPARAMS))

ADAM_HPARAMS = ("lr", "beta1", "beta2", "eps", "weight_decay")
ADAM_LR, ADAM_BETA1, ADAM_BETA2, ADAM_EPS, ADAM_WEIGHT_DECAY = range(len(ADAM_HPARAMS))
