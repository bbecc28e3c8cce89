"""Forward-only rows (gradcheck.forward_only): an engine's variant without a backward,
judged on its output alone, in rows that say so, after the case's own row."""

from __future__ import annotations

import numpy as np

from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.runner import run_checks

CASE = Sample.make("relu", [InputSpec("x", (3, 4), "away_from_zero", 0.1, 2.0)], "f32")


class WithVariants(EngineAdapter):
    """Our engine, with forward-only variants of relu: right, off by 1e-3, unable, broken."""

    def forward_only_checks(self, case):
        if case.op != "relu":
            return {}
        return {"right": None, "off": None, "broken": None, "unable": "no such kernel"}

    def forward_only_output(self, variant, case, arrays):
        if variant == "broken":
            raise RuntimeError("kernel exploded")
        out = np.maximum(arrays[0], 0).astype(np.float32)
        return (out + 1e-3 if variant == "off" else out), arrays


def test_variants_add_forward_only_rows_after_the_case():
    rows = run_checks([CASE], engine=WithVariants("cpu"), use_torch=False)
    assert [r.name for r in rows] == [str(CASE)] + [
        f"{CASE} [{v}: forward only]" for v in ("right", "off", "broken", "unable")]
    case, right, off, broken, unable = rows
    assert case.status == "pass" and "check" not in case.labels
    assert right.status == "pass" and right.labels["check"] == "forward only"
    assert right.labels["variant"] == "right" and right.labels["op"] == "relu"
    assert right.message == "forward only: the gradients are not checked"
    assert off.status == "fail" and off.message.startswith("forward: output differs")
    assert off.metrics["forward"] == "off" and "repro" in off.metrics
    assert broken.status == "error" and "kernel exploded" in broken.message
    assert (unable.status, unable.message) == ("unsupported", "no such kernel")


def test_an_engine_without_variants_adds_no_rows():
    assert len(run_checks([CASE], use_torch=False)) == 1
