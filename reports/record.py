"""The one result record type that every tool produces and every renderer reads."""

from __future__ import annotations

import dataclasses
from typing import Any

STATUSES = ("pass", "fail", "error", "crash", "skip", "unsupported", "vacuous")

# The counting word of each status, as the summaries (table, JSON, HTML) spell it.
STATUS_WORDS = {"pass": "passed", "fail": "failed", "error": "errors", "crash": "crashed",
                "skip": "skipped", "unsupported": "unsupported", "vacuous": "vacuous"}


@dataclasses.dataclass
class Result:
    """One checked thing: a gradcheck case, an optcheck scenario, an MNIST run.

    `name` is the case's one-line string (also its filter key); `labels` say what was
    checked (for gradcheck: op, backend, dtype, mode), `metrics` hold the measured numbers,
    both in display order; `message` says what went wrong, in words.
    Status: pass, fail, error (the check could not run), crash (the engine under test killed
    its worker process: an abort, a segfault, a hang), skip (nothing to check, e.g. an op
    without gradient), unsupported (the engine under test lacks the op), vacuous (nothing
    failed, but the check could not have seen an error of the size it promises to catch:
    a zero reference gradient, a tolerance that swallows it; an exit status of 1 under
    `strict`, see exit_status).
    """

    tool: str
    name: str
    status: str
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    message: str = ""
    labels: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "skip", "unsupported", "vacuous")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def exit_status(results, strict: bool = False) -> int:
    """0 when every result passed (or was skipped, unsupported or vacuous), 1 otherwise
    (any fail, error or crash); with `strict`, a vacuous result is 1 too."""
    return 0 if all(r.ok and not (strict and r.status == "vacuous")
                    for r in results) else 1


def summarize(results) -> dict[str, int]:
    """Counts per status, keyed by their words, plus the total:
    {"passed", "failed", "errors", "crashed", "skipped", "unsupported", "vacuous",
    "total"}."""
    counts = dict.fromkeys(STATUS_WORDS.values(), 0)
    total = 0
    for r in results:
        counts[STATUS_WORDS[r.status]] += 1
        total += 1
    counts["total"] = total
    return counts
