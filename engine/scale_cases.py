"""Shared pieces of the ops' scale cases (the `OpDef.scale` field, gradcheck's scale tier).

A scale case is a Sample with tier "scale", of a size that takes every fast path of the
backends' kernels (engine.backends.cpu.paths): the CPU backend splits a kernel over its
threads from threads.MIN_ELEMENTS (2^20) elements or threads.MIN_MACS (2^23) multiply-adds,
so the shapes here are just above those, with sides that are multiples of no thread count
(1031 is prime: chunks of 2, 3 and 7 threads are ragged) nor of the 8 x 8 tiles of the
transposed copy. Scale cases are float32: the fast paths are the same code for float64,
and float32 is where an accumulator's precision shows; the ops that accumulate (sum,
matmul, softmax) have float16 and bfloat16 cases too (HALF_SCALE_DTYPES), where an
accumulation in the 16-bit type instead of float32 shows (gradcheck.precision).

    scale_case("relu", [InputSpec("x", SQUARE)])       # relu(type=f32,x=[1031,1031])

Bench cases (the `OpDef.bench` field, timed by bench/bench_ops.py against torch) are made
here too: Samples with tier "bench", of the sizes the op meets in real models rather than
the smallest that take every path, so that a ratio against torch says what a user would
see. BENCH_ELEMENTS is the elementwise ops' (the issue's 8M elements), BENCH_ROWS the
row-wise ops' (norms, sums); float16 and bfloat16 cases (BENCH_HALF_DTYPES) where the op
runs in them and a 16-bit model would use it (softmax, sums, matmul, the activations, the
norms).

    bench_case("relu", [InputSpec("x", BENCH_ELEMENTS)])     # relu(type=f32,x=[2048,4096])
"""

from __future__ import annotations

import dataclasses

from engine.samples import Sample

SIDE = 1031                    # prime: ragged chunks for every thread count, ragged tiles
SQUARE = (SIDE, SIDE)          # 1,062,961 elements: above the 2^20 of a threaded split
TRANSPOSED = (1, 0)            # InputSpec.permute of a transposed view (the tiled copy)
SCALE_DTYPE = "f32"
HALF_SCALE_DTYPES = ("f16", "bf16")
# a sum over the rows of positive activations (post-ReLU values, probabilities): 320 rows
# of 3277 columns (ragged for 2, 3 and 7 threads), 1,048,640 elements, just above a threaded
# split; accumulated in float16 it errs some 14 times (bar 8) what torch does, within
# float16's fixed tolerance (0.75 of it)
HALF_ROWS = (320, 3277)


def scale_case(op: str, inputs, dtype: str = SCALE_DTYPE, /, **params) -> Sample:
    """A scale-tier Sample of `op` (as Sample.make, with tier "scale")."""
    return dataclasses.replace(Sample.make(op, inputs, dtype, **params), tier="scale")


BENCH_DTYPE = "f32"
BENCH_HALF_DTYPES = ("f16", "bf16")
BENCH_ELEMENTS = (2048, 4096)      # 8,388,608 elements: an activation of a large model
BENCH_ROWS = (4096, 4096)          # rows of a norm or a sum: 4096 tokens of 4096 features


def bench_case(op: str, inputs, dtype: str = BENCH_DTYPE, /, **params) -> Sample:
    """A bench-tier Sample of `op` (as Sample.make, with tier "bench")."""
    return dataclasses.replace(Sample.make(op, inputs, dtype, **params), tier="bench")


def bench_cases(op: str, inputs, dtypes=(BENCH_DTYPE,), /, **params) -> list[Sample]:
    """bench_case of `op` in each of `dtypes`."""
    return [bench_case(op, inputs, dtype, **params) for dtype in dtypes]
