"""The scoreboard (reports.scoreboard, `gradcheck-report`): real result files of small runs
(ours, torch, ours with a 1% error injected) merged into op x engine; bad input refused in
one line with exit status 2, a crafted file neither hanging it nor read past the cap."""

from __future__ import annotations

import json
import os
import re

import pytest

from gradcheck import report_cli
from reports import Result, render_json
from reports.scoreboard import ScoreboardError, merge, read_results, render_board
from tests.refusals import refusal_test


def run_gradcheck(tmp_path, name, *argv):
    from gradcheck.cli import main
    out = tmp_path / name
    code = main(["--op", "relu", "--dtype", "f32", "--no-progress", "--format", "json",
                 "--output", str(out), *argv])
    assert code in (0, 1)
    return str(out)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Three real result files: ours, torch's, ours with --inject scale:1.01."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("results")
    return (run_gradcheck(tmp, "ours.json", "--engine", "engine"),
            run_gradcheck(tmp, "torch.json", "--engine", "torch"),
            run_gradcheck(tmp, "injected.json", "--inject", "scale:1.01"))


def test_engines_come_from_the_files_and_clashes_get_the_file_name(files):
    sources = [read_results(f) for f in files]
    assert [s.engine for s in sources] == ["engine", "torch", "engine"]
    rows = merge(sources)
    assert [s.name for s in sources] == ["engine (ours.json)", "torch",
                                         "engine (injected.json)"]
    assert len(rows) == sum(len(s.rows) for s in sources)
    assert {r.labels["engine"] for r in rows} == {s.name for s in sources}


def test_same_file_name_in_two_directories_gets_its_path(files, tmp_path):
    other = tmp_path / "ours.json"
    other.write_bytes(open(files[0], "rb").read())
    sources = [read_results(files[0]), read_results(other)]
    merge(sources)
    assert [s.name for s in sources] == [f"engine ({files[0]})", f"engine ({other})"]


def test_text_board_is_op_by_engine_with_counts_and_the_failing_rows(files):
    sources = [read_results(f) for f in files]
    text = render_board(merge(sources), sources, "plain")
    head, _, relu, total = text.splitlines()[:4]
    assert head.split() == ["op", "engine", "(ours.json)", "torch", "engine",
                            "(injected.json)"]
    n = len(sources[0].rows)
    failed = sum(r.status == "fail" for r in sources[2].rows)
    assert failed > 0 and relu.startswith("relu") and total.startswith("total")
    passed = f"{n - failed} pass, " if failed < n else ""
    assert re.search(rf"{n} pass\s+{n} pass\s+{passed}{failed} fail$", relu)
    assert f"failing rows ({failed}):" in text
    assert "[engine (injected.json)] FAIL relu(type=f32" in text
    assert "reproduce: gradcheck --inject scale:1.01 --op relu" in text
    assert "injected scale:1.01" in text


def test_html_board_has_engines_as_columns_and_links_to_every_failing_row(files):
    sources = [read_results(f) for f in files]
    rows = merge(sources)
    page = render_board(rows, sources, "html")
    assert "<title>gradcheck scoreboard</title>" in page
    assert "<th>op</th><th>engine (ours.json)</th><th>torch</th>" \
           "<th>engine (injected.json)</th>" in page
    failing = [i for i, r in enumerate(rows) if r.status == "fail"]
    assert failing and all(f'<a href="#r{i}">' in page for i in failing)
    assert all(f'id="r{i}"' in page for i in failing)


def test_markdown_board_is_a_github_table(files):
    sources = [read_results(f) for f in files]
    text = render_board(merge(sources), sources, "github")
    lines = text.splitlines()
    assert lines[0].startswith("| op ") and set(lines[1]) <= set("|:- ")
    assert lines[2].startswith("| relu ")


@pytest.mark.parametrize("name, fmt, marker", [
    ("board.html", None, "<!DOCTYPE html>"), ("board.md", None, "| op "),
    ("board.txt", None, "op "), ("board.out", "html", "<!DOCTYPE html>")])
def test_cli_writes_the_format_its_output_names(files, tmp_path, capsys, name, fmt, marker):
    out = tmp_path / name
    argv = [*files, "--output", str(out), *(["--format", fmt] if fmt else [])]
    assert report_cli.main(argv) == 1    # a merged row failed
    assert out.read_text().startswith(marker)
    assert f"wrote {out}" in capsys.readouterr().err


def test_cli_without_failures_exits_0_and_prints_the_table(files, capsys):
    assert report_cli.main(files[:2]) == 0
    assert capsys.readouterr().out.startswith("op ")


def test_gradcheck_report_is_the_same_command(files, capsys):
    from gradcheck.cli import main
    assert main(["report", *files[:2]]) == 0
    assert "torch" in capsys.readouterr().out.splitlines()[0]


def one_line_refusal(argv, capsys, pattern):
    with pytest.raises(SystemExit) as exc:
        report_cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and re.search(pattern, err)


def test_cli_usage_errors_are_one_line(files, capsys):
    one_line_refusal([files[0], "--output", "b.json"], capsys, "not .json")
    one_line_refusal([files[0], "--output", "b.md", "--format", "html"], capsys,
                     "contradicts")
    one_line_refusal([], capsys, "required")


def test_cli_bad_files_are_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert report_cli.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gradcheck-report: {bad}: not JSON")
    assert len(err.splitlines()) == 1
    assert report_cli.main([str(tmp_path / "missing.json")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_cli_size_caps_each_file_and_all_together(files, tmp_path, capsys):
    big = write(tmp_path, b" " * (2**20 + 1), "big.json")
    assert report_cli.main([str(big), "--max-mib", "1"]) == 2
    assert "1048577 bytes, more than the 1048576" in capsys.readouterr().err
    parts = [write(tmp_path, b" " * 2**20, f"p{k}.json") for k in range(5)]
    assert report_cli.main([*map(str, parts), "--max-mib", "1"]) == 2
    assert "5242880 bytes together, more than 4194304" in capsys.readouterr().err
    one_line_refusal([files[0], "--max-mib", "0"], capsys, "positive whole number")


def test_an_unwritable_output_is_exit_2(files, tmp_path, capsys):
    assert report_cli.main([files[0], "--output", str(tmp_path / "no" / "b.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def write(tmp_path, data: bytes | str, name="r.json"):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def doc(results=()):
    return render_json(list(results) or [Result("gradcheck", "relu", "pass")], "gradcheck",
                       {"engine": "engine 0.1.0 (cpu backend)"})


def _read(kind_and_data):
    import tempfile
    kind, data = kind_and_data
    d = tempfile.mkdtemp()
    path = os.path.join(d, "r.json")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        os.mkdir(path)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return read_results(path, limit=4096 if kind != "deep" else 1 << 20)


test_bad_files_are_refused = refusal_test(_read, ScoreboardError, [
    (("file", b"{not json"), r"r\.json: not JSON: Expecting property name"),
    (("file", b"\xff\xfe{}"), r"not UTF-8 text \(byte 0\)"),
    (("file", json.dumps({"schema": "other/1"}).encode()), r"schema is 'other/1'"),
    # deeper than any recursion limit (tinygrad, imported by another test in this worker,
    # raises it to 10,000: 2,000 levels then parsed and failed as "not an object")
    (("deep", b"[" * 200_000 + b"]" * 200_000), r"nested too deeply"),
    (("file", b" " * 5000), r"5000 bytes, more than the 4096"),
    (("file", doc().replace('"total": 1', '"total": 9').encode()), r"summary total 9"),
    (("fifo", b""), r"not a regular file"),     # opened without blocking, then refused
    (("dir", b""), r"not a regular file|Is a directory"),
])


def test_non_finite_metrics_come_back_as_floats(tmp_path):
    r = Result("gradcheck", "abs", "fail", {"max_abs_err": float("nan"),
                                            "max_rel_err": float("inf")}, "off",
               {"op": "abs", "engine": "ggml"})
    source = read_results(write(tmp_path, doc([r])))
    back = source.rows[0]
    assert source.engine == "ggml" and back.labels == {"op": "abs", "engine": "ggml"}
    assert back.metrics["max_rel_err"] == float("inf")
    assert back.metrics["max_abs_err"] != back.metrics["max_abs_err"]   # NaN
