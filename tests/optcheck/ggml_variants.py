"""Variants of optcheck's ggml adapter for the tests, importable in its worker process (where
their methods run): `optcheck --engine tests.optcheck.ggml_variants:SwappedBiasCorrection`.
"""

from __future__ import annotations

import ctypes

from checkkit import ggml
from optcheck.adapters.ggml_adapter import GgmlOptimizer

CRASH_LR = 0.1     # AssertsAtLr's steppers with this learning rate abort in the worker


class SwappedBiasCorrection(GgmlOptimizer):
    """AdamW's hyperparameter tensor with beta1h and beta2h in each other's place: a layout
    slip that ggml cannot notice (the tensor still holds 7 floats)."""

    def step_params(self, optimizer, hp, t):
        values = super().step_params(optimizer, hp, t)
        if optimizer != "sgd":
            values[5], values[6] = values[6], values[5]
        return values


class AssertsAtLr(GgmlOptimizer):
    """ggml, but a stepper whose learning rate is CRASH_LR fails a real GGML_ASSERT in the
    worker before it is made: ggml_opt_step_sgd on a tensor that is not a param."""

    def worker_open(self, key, optimizer, groups, dropped):
        if any(g.hp.get("lr") == CRASH_LR for g in groups):
            ctx = self.lib.ggml_init(ggml.InitParams(1 << 16, None, False))
            ne = (ctypes.c_int64 * ggml.MAX_DIMS)(2, 1, 1, 1)
            w = self.lib.ggml_new_tensor(ctx, ggml.GGML_TYPE_F32, 1, ne)
            self.lib.ggml_opt_step_sgd(ctx, w, w, w)   # GGML_ASSERT(a->flags & PARAM) fails
        super().worker_open(key, optimizer, groups, dropped)
