"""Chaining prepared calls: the one helper the executor and the CPU kernels share.

A module of its own, below every backend: the CPU kernels' modules import it without
importing the `engine.backends` package, whose backend lookup imports them (a cycle).
"""

from __future__ import annotations


def sequence(*calls):
    """One zero-argument call running `calls` in order (none: a call that does nothing);
    the executor and the kernels' prepared calls chain their steps with it."""
    if len(calls) == 1:
        return calls[0]

    def run_all():
        for c in calls:
            c()
    return run_all
