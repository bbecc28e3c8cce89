"""What ggml's backward pass does not cover, read against ggml_compute_backward (ggml.c).

- NO_BACKWARD: registry ops whose ggml counterpart has no backward at all; the adapter
  reports their cases `unsupported` (building the backward graph would abort);
- DECLINED: inputs whose gradient ggml does not compute (soft_max's mask,
  cross_entropy_loss's labels); the adapter declines them (see
  gradcheck.adapters.base), and gradcheck checks the op's other inputs.

ggml differentiates every op of ops.OPS (none of which is in NO_BACKWARD) in each of its
inputs but the DECLINED ones.
"""

from __future__ import annotations

# registry op -> {input: why ggml computes no gradient of it}: the adapter declines these
# gradients (gradcheck checks the other inputs) and leaves the inputs out of the params, as
# ggml_compute_backward asserts that they need no gradient
DECLINED = {
    "softmax": {"mask": "ggml has no backward for soft_max's mask (ggml_compute_backward "
                        "asserts 'backward pass for softmax mask not implemented')"},
    "cross_entropy_loss": {"labels": "ggml has no backward for cross_entropy_loss's labels "
                                     "(ggml_compute_backward asserts 'backward pass for "
                                     "labels not implemented')"},
}

# registry ops whose ggml counterpart has no backward: ggml_build_backward_expand aborts
# ("unsupported ggml op for backward pass" / "unsupported unary op for backward pass")
NO_BACKWARD = {
    "tanh": "ggml_tanh (GGML_UNARY_OP_TANH)", "sigmoid": "ggml_sigmoid (GGML_UNARY_OP_SIGMOID)",
    "gelu": "ggml_gelu (GGML_UNARY_OP_GELU)", "gelu_erf": "ggml_gelu_erf (GGML_UNARY_OP_GELU_ERF)",
    "elu": "ggml_elu (GGML_UNARY_OP_ELU)", "hardswish": "ggml_hardswish (GGML_UNARY_OP_HARDSWISH)",
    "leaky_relu": "ggml_leaky_relu (GGML_OP_LEAKY_RELU)", "clamp": "ggml_clamp (GGML_OP_CLAMP)",
    "norm": "ggml_norm (GGML_OP_NORM)", "concat": "ggml_concat (GGML_OP_CONCAT)",
    "pad": "ggml_pad_ext (GGML_OP_PAD)", "pool_1d": "ggml_pool_1d (GGML_OP_POOL_1D)",
    "conv_transpose_2d": "ggml_conv_transpose_2d_p0 (GGML_OP_CONV_TRANSPOSE_2D)",
    "get_rows_back": "ggml_get_rows_back (GGML_OP_GET_ROWS_BACK)",
    "im2col_back": "ggml_im2col_back (GGML_OP_IM2COL_BACK)",
    "im2col_1d_back": "ggml_im2col_back (GGML_OP_IM2COL_BACK)",
}
