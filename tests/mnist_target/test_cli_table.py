"""mnist-regress's plain report: the compact columns and a summary per architecture by
default, every column with --verbose, on stdout also when the report goes to a file; the
progress bars only when stderr is a terminal. Training is a stand-in (regress.run_arch and
the data replaced), so these tests are fast."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import mnist_target.cli
from mnist_target import regress
from mnist_target.cli import main
from mnist_target.run import TrainConfig
from reports.record import Result
from tests.cli_helpers import assert_progress_only_on_a_terminal


@pytest.fixture
def runs(monkeypatch):
    """regress.run_arch replaced by a run with two bars; the progress flags it was given."""
    calls = []

    def run_arch(arch, data, config, options, log):
        calls.append(options.progress)
        return SimpleNamespace(arch=arch, interrupted=False)

    def results_of(run, floors=True, seed_in_names=False):
        labels = {"arch": run.arch, "engine": "engine", "seed": 0}
        return [Result("mnist", "fc, engine: test accuracy vs torch", "pass",
                       {"measured": 0.9801, "torch": 0.9805, "diff": 4e-4, "bar": 0.005},
                       labels={**labels, "check": "conformance"}),
                Result("mnist", "fc, engine: seconds per epoch", "pass",
                       {"measured": 1.5, "torch": 0.5, "ratio": 3.0},
                       "reported, not a bar", {**labels, "check": "time"})]

    monkeypatch.setattr(mnist_target.cli, "_prepare",
                        lambda args, *outputs: (TrainConfig(), SimpleNamespace(source="test")))
    monkeypatch.setattr(regress, "run_arch", run_arch)
    monkeypatch.setattr(regress, "results_of", results_of)
    monkeypatch.setattr(regress, "seed_summary", lambda runs: [])
    monkeypatch.setattr(regress, "history_meta", lambda runs: {})
    return calls


def test_default_is_compact_with_a_summary_per_arch(runs, capsys):
    assert main(["regress", "--arch", "fc", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["case", "status", "measured", "torch", "bar"]
    assert "ratio" not in lines[0] and "reported, not a bar" not in "\n".join(lines)
    assert any(line.split() == ["fc", "2", "0", "0"] for line in lines), lines
    assert lines[-1] == "2 passed"


def test_verbose_gives_every_column_also_beside_a_report_file(runs, tmp_path, capsys):
    path = tmp_path / "report.json"
    assert main(["regress", "--arch", "fc", "--no-progress", "--output", str(path),
                 "--verbose"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:5] == ["case", "arch", "engine", "seed", "check"]
    assert "ratio" in header and "message" in header
    assert '"ratio": 3.0' in path.read_text()


def test_progress_only_when_stderr_is_a_terminal(runs, monkeypatch, capsys):
    assert_progress_only_on_a_terminal(main, ["regress", "--arch", "fc"], runs, monkeypatch)
