"""The fuzz suite's fixtures (one bounded child per test process, the user files) and its
summary: cases run per surface and the distinct failures found, printed after the run
(under xdist the workers' counts travel in each test's user_properties), and written to
$GRADVERIFY_FUZZ_LOG when it is set."""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from pathlib import Path

import pytest

from tests.fuzz.runner import Child
from tests.fuzz.userfiles import fingerprint, make_user_dir

_COUNTS: collections.Counter = collections.Counter()
_FINDINGS: dict[tuple[str, str], tuple[str, str]] = {}   # (surface, kind) -> problem, input


@dataclasses.dataclass(repr=False)
class FuzzEnv:
    child: Child
    user_path: Path
    user: str
    scratch: str
    cases: str
    valid: dict[str, bytes]
    user_fingerprint: dict
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    findings: list = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:   # hypothesis prints it with every failing example
        return f"FuzzEnv(user={self.user!r}, scratch={self.scratch!r})"

    def _repr_pretty_(self, printer, cycle) -> None:   # hypothesis's printer: not the files
        printer.text(repr(self))

    def count(self, surface: str) -> None:
        self.counts[surface] += 1


@pytest.fixture(scope="session")
def fuzz_session(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    user = root / "user"
    paths = make_user_dir(user)
    for name in ("scratch", "cases", "cache"):
        (root / name).mkdir()
    child = Child(root / "child", env={"GRADVERIFY_CACHE": str(root / "cache")})
    env = FuzzEnv(child, user, str(user), str(root / "scratch"), str(root / "cases"),
                  {name: Path(p).read_bytes() for name, p in paths.items()}, fingerprint(user))
    yield env
    child.close()


@pytest.fixture
def fuzz_env(fuzz_session, request):
    """The session's FuzzEnv; this test's case counts and failures go into its report."""
    fuzz_session.counts, fuzz_session.findings = collections.Counter(), []
    yield fuzz_session
    request.node.user_properties.append(("fuzz_cases", dict(fuzz_session.counts)))
    request.node.user_properties.append(("fuzz_findings", list(fuzz_session.findings)))


def _kind_of(problem: str) -> str:
    """The kind of a failure, for counting distinct ones: its words, without the quoted
    parts and numbers that vary from case to case."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", problem))[:70]


def pytest_runtest_logreport(report):
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == "fuzz_cases":
            _COUNTS.update(value)
        elif name == "fuzz_findings":
            for surface, problem, shown in value:
                key = (surface, _kind_of(problem))
                if key not in _FINDINGS or len(shown) < len(_FINDINGS[key][1]):
                    _FINDINGS[key] = (problem, shown)


def pytest_sessionfinish(session, exitstatus):
    if _FINDINGS and exitstatus == 0:   # a survey run (GRADVERIFY_FUZZ_SURVEY) found some
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _COUNTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fuzz cases per surface")
    for surface, n in sorted(_COUNTS.items()):   # "cli:TOOL exit N": how its cases ended
        write(f"{surface:<20} {n:>7}" if " " not in surface else f"    {surface:<24} {n:>5}")
    write(f"{'total':<20} {sum(n for s, n in _COUNTS.items() if ' ' not in s):>7}")
    if _FINDINGS:
        terminalreporter.section(f"fuzz failures: {len(_FINDINGS)} distinct (shortest input)")
        for (surface, _), (problem, shown) in sorted(_FINDINGS.items()):
            write(f"{surface}: {problem[:300]}")
            write(f"    {shown[:300]}")
    log = os.environ.get("GRADVERIFY_FUZZ_LOG")
    if log:
        with open(log, "w", encoding="utf-8") as f:
            for surface, n in sorted(_COUNTS.items()):
                f.write(f"count\t{surface}\t{n}\n")
            for (surface, _), (problem, shown) in sorted(_FINDINGS.items()):
                f.write(f"finding\t{surface}\t{problem}\t{shown}\n")
