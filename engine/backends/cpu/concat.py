"""CPU kernel of concat: a and b copied into their two blocks of the output.

Along a later axis than the first, every input runs along out's axis 0, so the output's
rows are cut into ranges (with the same rows of a and b) copied side by side on the
engine's threads (split:cpu_concat, from threads.MIN_ELEMENTS): copy_block's loops run
on one thread, and two (2048, 2048) float32 halves took 6.7 ms against torch's 3.2 on two
threads (`python bench/bench_ops.py --op concat`, the quiet machine; 3.6 ms split). Along
axis 0 the inputs are not cut with the output's rows, and it runs whole.
"""

from __future__ import annotations

from engine.backends.calls import sequence
from engine.backends.cpu import threads
from engine.backends.cpu.block import copy_block_call
from engine.backends.cpu.jit import bindable


@bindable
def _cpu_concat(out, ins, axis):
    """kernel(out, [a, b], axis), laid out once when bound (block.copy_block_call)."""
    a, b = ins
    head = (slice(None),) * axis
    return sequence(copy_block_call(out[head + (slice(0, a.shape[axis]),)], a),
                    copy_block_call(out[head + (slice(a.shape[axis], None),)], b))


def _rows(out, ins, parts):
    """Ranges of out's rows with the same rows of a and b, where both run along out's axis
    0 (a concat along a later axis; along axis 0 with an empty b, too); else whole."""
    if not all(threads.aligned(a, out) for a in ins):
        return None
    return threads.elementwise_chunks(out, ins, parts)


cpu_concat = threads.split(_cpu_concat, chunks=_rows)
cpu_concat.__doc__ = """Dispatcher of concat: kernel(out, [a, b], axis) (module doc)."""
