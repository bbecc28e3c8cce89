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

from collections import Counter

from reports import Result

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
    "gelu_quick": "ggml_gelu_quick (GGML_UNARY_OP_GELU_QUICK)",
    "out_prod": "ggml_out_prod (GGML_OP_OUT_PROD; ggml uses it inside MUL_MAT's backward)",
    **{name: f"ggml_{name}_split (GGML_GLU_OP_{name.upper()}: 'unsupported glu op for "
             "backward pass')" for name in ("geglu", "geglu_erf", "geglu_quick", "reglu")},
}


# --- 16-bit cases ---------------------------------------------------------------------------
# The 16-bit inputs of a case become GGML_TYPE_F16 / GGML_TYPE_BF16 tensors. ggml 0.20.2 can
# differentiate through F16 tensors only: ggml_build_backward_expand asserts that every
# source on the gradient path is F32 or F16 (ggml.c:7277). Its gradients of F16 tensors come
# out F32 where the backward rule makes them with F32 ops (out_prod, get_rows_back,
# im2col_back, the F32 gradient reshaped for CPY) and F16 where it multiplies by an F16
# tensor (unary ops: ggml_mul(F16, F32) -> F16). Registry ops whose ggml counterpart has F16
# kernels forward and backward (ggml-cpu/ops.cpp, unary-ops.cpp, binary-ops.cpp):
F16_OPS = {
    "cast": "ggml_cast (GGML_OP_CPY, ops.cpp ggml_compute_forward_dup: F32, F16 and BF16 to "
            "each other); backward: the F32 gradient reshaped (ggml.c, GGML_OP_CPY)",
    "get_rows": "ggml_get_rows of an F16 table gives F32 rows (ggml.c: 'TODO: implement non "
                "F32 return'); backward ggml_get_rows_back, F32",
    "matmul": "ggml_mul_mat of F16 weights converts its second operand to F16, its "
              "vec_dot_type (ggml-cpu.c type_traits_cpu), and returns F32; backward "
              "ggml_out_prod (ops.cpp ggml_compute_forward_out_prod_f16_f32), F32",
    "conv_2d": "ggml_conv_2d of an F16 kernel: im2col columns in F16, then ggml_mul_mat, F32 "
               "out; backward im2col_back and out_prod, F32",
    "pool_2d": "ggml_pool_2d of an F16 input (ops.cpp: F16 source, F32 output); backward "
               "ggml_pool_2d_back",
    **{name: f"ggml_{name} (unary-ops.cpp, F16 in and out); backward: ggml_mul by an F16 "
             "tensor (binary-ops.cpp F16 x F32 -> F16)"
       for name in ("abs", "sgn", "neg", "step", "relu", "exp", "silu")},
    **{name: f"ggml_{name} (binary-ops.cpp, F16 and F16 or F32)" for name in ("add", "sub")},
    "attention": "ggml_mul_mat of F16 k and q (F16 is F16's vec_dot_type) gives F32 scores: "
                 "F32 soft_max, ggml_mul_mat of the F16 v by them; backward ggml_out_prod "
                 "(ops.cpp ggml_compute_forward_out_prod_f16_f32), F32",
    **{name: "a view or copy of the F16 tensor (layout only)"
       for name in ("permute", "transpose", "reshape", "cont", "block", "repeat",
                    "broadcast_to")},
}
# registry ops that ggml runs forward in F16 but whose forward or backward pass reaches a
# kernel without an F16 case (a GGML_ABORT in the type switch, or an F32 assert)
F16_NO_KERNEL = {
    "sum": "ggml_sum_rows (ops.cpp:1506, F32 only)",
    "sum_rows": "ggml_sum_rows (ops.cpp:1506, F32 only)",
    "mean": "ggml_mean (ops.cpp:1563, F32 only)",
    "scale": "ggml_scale (ops.cpp:4633, F32 only)",
    "sqr": "ggml_scale in SQR's backward (ops.cpp:4633, F32 only)",
    "rms_norm": "ggml_rms_norm (ops.cpp:3873, F32 only)",
    "softmax": "ggml_soft_max (ops.cpp:5580, F32 only)",
    "cross_entropy_loss": "ggml_cross_entropy_loss (ops.cpp:11607, F32 only)",
    "repeat_back": "ggml_repeat_back (ops.cpp:1893, F32 only)",
    "set": "ggml_set (ops.cpp:4827, F32 only)",
    "acc": "ggml_acc (ggml.c:2187 asserts F32)",
    "im2col": "ggml_im2col into F32 columns (ops.cpp:6357 asserts an F32 image)",
    "im2col_1d": "ggml_im2col into F32 columns (ops.cpp:6357 asserts an F32 image)",
    **{name: f"the backward's ggml_mul(F32 gradient, F16 {name}') (binary-ops.cpp:135: no "
             "F32 x F16 kernel)" for name in ("sqrt", "log", "sin", "cos", "softplus")},
    **{name: "ggml_rms_norm (ops.cpp:3873, F32 only)" for name in ("attention_block",
                                                                  "mlp_block")},
    "mul": "its backward's ggml_mul(F32 gradient, F16 operand) (binary-ops.cpp:135: no "
           "F32 x F16 kernel)",
    "div": "its backward's ggml_div(F32 gradient, F16 operand) (binary-ops.cpp:135: no "
           "F32 x F16 kernel)",
}
BF16_NO_BACKWARD = (
    "ggml has no backward through BF16 tensors: ggml_build_backward_expand asserts that every "
    "tensor on the gradient path is F32 or F16 (ggml.c:7277, 'node->src[j]->type == "
    "GGML_TYPE_F32 || node->src[j]->type == GGML_TYPE_F16'), and ggml_out_prod, MUL_MAT's "
    "backward, has no BF16 kernel (ops.cpp ggml_compute_forward_out_prod: GGML_ABORT); ggml "
    "runs bf16 forward only (GgmlAdapter.forward_only)")


def half_unsupported(case) -> str | None:
    """Why ggml cannot run the 16-bit case `case` forward and backward, or None (also for
    a case without 16-bit dtypes)."""
    dtypes = case.float_dtypes
    if "bf16" in dtypes:
        return BF16_NO_BACKWARD
    if "f16" in dtypes and case.op not in F16_OPS:
        if case.op in F16_NO_KERNEL:
            return f"ggml has no F16 kernel for {F16_NO_KERNEL[case.op]}; it aborts"
        return f"ggml has no F16 case of {case.op} in this adapter"
    return None


# --- the coverage table: ggml's backward switch against the registry ------------------------
# Every case of ggml_compute_backward (ggml.c, ggml 0.20.2) in its order, with the registry
# ops whose cases check it through the adapter. `gradcheck --engine ggml --coverage` runs
# those ops and reports one row per entry (coverage_rows). A ggml op none of whose registry
# ops exists yet is reported as not covered, with the reason.
BACKWARD_SWITCH: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("DUP", ("cast",)), ("ADD", ("add",)), ("ADD1", ("add1",)), ("ACC", ("acc",)),
    ("SUB", ("sub",)), ("MUL", ("mul",)), ("DIV", ("div",)), ("SQR", ("sqr",)),
    ("SQRT", ("sqrt",)), ("LOG", ("log",)), ("SIN", ("sin",)), ("COS", ("cos",)),
    ("SUM", ("sum",)), ("SUM_ROWS", ("sum_rows", "sum")), ("MEAN", ("mean",)),
    ("REPEAT", ("repeat", "broadcast_to")), ("REPEAT_BACK", ("repeat_back",)),
    ("RMS_NORM", ("rms_norm",)), ("MUL_MAT", ("matmul",)), ("SCALE", ("scale",)),
    ("SET", ("set",)), ("CPY", ("cast",)), ("CONT", ("cont",)), ("RESHAPE", ("reshape",)),
    ("VIEW", ("block",)), ("PERMUTE", ("permute",)), ("TRANSPOSE", ("transpose",)),
    ("GET_ROWS", ("get_rows",)), ("DIAG_MASK_INF", ("diag_mask_inf",)),
    ("DIAG_MASK_ZERO", ("diag_mask_zero",)), ("SOFT_MAX", ("softmax",)),
    ("ROPE", ("rope",)), ("IM2COL", ("im2col", "im2col_1d")), ("POOL_2D", ("pool_2d",)),
    ("WIN_PART", ("win_part",)), ("WIN_UNPART", ("win_unpart",)),
    ("UNARY_ABS", ("abs",)), ("UNARY_SGN", ("sgn",)), ("UNARY_NEG", ("neg",)),
    ("UNARY_STEP", ("step",)), ("UNARY_RELU", ("relu",)), ("UNARY_SILU", ("silu",)),
    ("UNARY_EXP", ("exp",)), ("UNARY_EXPM1", ("expm1",)), ("UNARY_SOFTPLUS", ("softplus",)),
    ("CROSS_ENTROPY_LOSS", ("cross_entropy_loss",)), ("GLU_SWIGLU", ("swiglu",)),
)
# Which results of an op check which ggml op, where an op's cases split between two (cast:
# DUP to the same dtype, CPY to another; sum: SUM over all axes, SUM_ROWS along the rows),
# read from the case string (its parameters print as name=value)
CASE_FILTERS = {
    ("DUP", "cast"): lambda r: f"dtype={r.labels.get('dtype')})" in r.name,
    ("CPY", "cast"): lambda r: f"dtype={r.labels.get('dtype')})" not in r.name,
    ("SUM", "sum"): lambda r: "axis=None" in r.name,
    ("SUM_ROWS", "sum"): lambda r: "axis=None" not in r.name,
}



def _forward_only(r) -> bool:
    """Whether result `r` is a forward-only row (gradcheck.forward_only)."""
    return r.labels.get("check") == "forward only"


# Rows after the switch's, each (row name, registry ops, which of their results): ggml's
# flash attention, which has no case in the switch and is checked forward only
# (gradcheck.forward_only); the attention ggml differentiates, unfused (ggml_mul_mat,
# ggml_diag_mask_inf, ggml_soft_max_ext, ggml_mul_mat); llama.cpp's decoder layer built from
# ggml's own ops (ggml/attention.py). The switch's rows count no forward-only result.
BEYOND_SWITCH: tuple[tuple[str, tuple[str, ...], object], ...] = (
    ("GGML_OP_FLASH_ATTN_EXT (forward only)", ("attention",), _forward_only),
    ("attention, unfused (MUL_MAT, DIAG_MASK_INF, SOFT_MAX)", ("attention",),
     lambda r: not _forward_only(r)),
    ("llama layer: attention_block", ("attention_block",), lambda r: True),
    ("llama layer: mlp_block", ("mlp_block",), lambda r: True),
)


def _table():
    """(row name, registry ops, result filter per op) of every row, in order."""
    rows = [(f"GGML_OP_{ggml_op}", ops,
             {op: CASE_FILTERS.get((ggml_op, op), lambda r: not _forward_only(r))
              for op in ops}) for ggml_op, ops in BACKWARD_SWITCH]
    return rows + [(name, ops, dict.fromkeys(ops, keep)) for name, ops, keep in BEYOND_SWITCH]


def coverage_ops() -> list[str]:
    """The registry ops that check ggml's backward switch and the rows after it (each once,
    in the table's order)."""
    return list(dict.fromkeys(op for _, ops, _ in _table() for op in ops))


def coverage_rows(results, registered) -> list[Result]:
    """One row per entry of BACKWARD_SWITCH (and of BEYOND_SWITCH) from gradcheck's
    `results` of coverage_ops() in ggml: the registry ops that check it, the number of
    cases run and their verdicts. The
    row fails if any case failed or errored, crashes if any crashed (and none failed),
    passes if some passed and nothing else went wrong; it is unsupported, with the reason,
    when no case could run in ggml or no registry op exists for it (`registered`: the
    registry's op names)."""
    by_op: dict[str, list[Result]] = {}
    for r in results:
        by_op.setdefault(r.labels.get("op"), []).append(r)
    rows = []
    for name, ops, keep in _table():
        present = [op for op in ops if op in registered]
        mine = [r for op in present for r in by_op.get(op, []) if keep[op](r)]
        counts = Counter(r.status for r in mine)
        run = sum(counts[s] for s in ("pass", "fail", "error", "crash"))
        if counts["fail"] or counts["error"]:
            status = "fail"
        elif counts["crash"]:
            status = "crash"
        elif counts["pass"]:
            status = "pass"
        else:
            status = "unsupported"
        why = _first_message(mine, status)
        if not present:
            why = f"not covered: no registry op {' or '.join(ops)}"
        elif not mine:
            why = f"not covered: {', '.join(present)} has no cases for it"
        rows.append(Result(
            tool="gradcheck-coverage", name=name, status=status, message=why,
            labels={"checked_by": ", ".join(present) or "-"},
            metrics={"cases": len(mine), "run": run, "passed": counts["pass"],
                     "failed": counts["fail"] + counts["error"], "crashed": counts["crash"],
                     "unsupported": counts["unsupported"] + counts["skip"]}))
    return rows


def _first_message(results, status) -> str:
    """A failing or crashing row's reason: the first such case and its message (with the
    command that reproduces it); an unsupported row's: the first case's reason."""
    wanted = {"fail": ("fail", "error"), "crash": ("crash",),
              "unsupported": ("unsupported", "skip")}.get(status, ())
    for r in results:
        if r.status in wanted:
            return r.message if status == "unsupported" else f"{r.name}: {r.message}"
    return ""
