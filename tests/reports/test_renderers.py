"""The renderers of `reports`: every format on a mix of statuses, JSON round trips, JUnit
counts, HTML escaping and plots, and atomic writes."""

from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from reports import (
    FORMATS,
    SCHEMA_ID,
    OutputError,
    Result,
    SchemaError,
    exit_status,
    format_for_path,
    load_json,
    render,
    render_html,
    render_json,
    render_junit,
    render_table,
    summary_line,
    write_atomic,
)
from tests.refusals import refusal_test

XSS = "<script>alert('x')</script>"


def mixed_results() -> list[Result]:
    """Every status once or more, numpy scalars, a tuple, NaN and Inf, markup in names."""
    def labels(op, dtype="f32"):
        return {"op": op, "backend": "cpu", "dtype": dtype, "mode": "full"}

    return [
        Result("gradcheck", "relu(type=f32,x=[3,4])", "pass",
               {"checked": np.int64(12), "max_abs_err": np.float32(3e-7),
                "max_rel_err": 1.5e-6}, labels=labels("relu")),
        Result("gradcheck", "abs(type=f64,x=[5])", "fail",
               {"checked": 5, "max_abs_err": float("nan"), "max_rel_err": float("inf"),
                "worst_index": (1, 2)},
               "x: 1/5 off | worst at [1, 2]: backprop 1, numerical <2>", labels("abs", "f64")),
        Result("gradcheck", XSS, "fail", {"checked": 3, "max_abs_err": 0.02,
                                          "max_rel_err": 0.0}, "a & b", labels("div")),
        Result("gradcheck", "conv_2d(type=f32)", "error", {},
               "ShapeError: conv_2d: [1,2] vs [3]\nsecond line", labels("conv_2d")),
        Result("gradcheck", "argmax(type=f32,x=[4])", "skip", {},
               "no gradient: integer output", labels("argmax")),
        Result("gradcheck", "gguf_op(type=f32)", "unsupported", {}, "", labels("gguf_op")),
    ]


COUNTS = {"passed": 1, "failed": 2, "errors": 1, "crashed": 0, "skipped": 1, "unsupported": 1,
          "vacuous": 0, "total": 6}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_every_status(fmt):
    text = render(mixed_results(), fmt, "gradcheck", meta={"argv": ["--op", "relu"]},
                  show="all")
    assert text.endswith("\n")
    for r in mixed_results():
        if fmt in ("plain", "github"):
            assert r.status.upper() in text
        elif fmt == "json":
            assert f'"status": "{r.status}"' in text
    assert "relu(type=f32,x=[3,4])" in text


def test_table_columns_labels_then_metrics_then_status_and_message():
    text = render_table(mixed_results(), "plain")
    header = text.splitlines()[0].split()
    assert header == ["case", "op", "backend", "dtype", "mode", "checked", "max_abs_err",
                      "max_rel_err", "worst_index", "status", "message"]
    relu = next(line for line in text.splitlines() if line.startswith("relu"))
    assert "3e-07" in relu and "1.5e-06" in relu and "PASS" in relu
    abs_row = next(line for line in text.splitlines() if line.startswith("abs("))
    assert "nan" in abs_row and "inf" in abs_row and "[1,2]" in abs_row


def test_table_without_messages_has_no_message_column_and_none_is_empty():
    rs = [Result("t", "a", "pass", {"x": None, "y": 1.23456}), Result("t", "b", "pass",
                                                                     {"y": 2})]
    text = render_table(rs)
    assert "message" not in text and "None" not in text and "1.23" in text
    assert render_table(rs, "simple") == text  # the former name of "plain"


def test_github_table_is_markdown_with_pipes_escaped():
    text = render_table(mixed_results(), "github")
    lines = text.splitlines()
    assert lines[0].startswith("| case") and set(lines[1]) <= set("|-: ")
    assert "off \\| worst" in text
    n_cells = lines[0].count(" | ")
    assert all(line.replace("\\|", "").count(" | ") == n_cells for line in lines[2:])


def test_unknown_formats_raise():
    with pytest.raises(ValueError, match="format"):
        render_table(mixed_results(), "latex")
    with pytest.raises(ValueError, match="format"):
        render(mixed_results(), "csv", "gradcheck")


def test_summary_line_counts_every_status():
    assert summary_line(mixed_results()) == \
        "1 passed, 2 failed, 1 errors, 1 skipped, 1 unsupported"
    assert summary_line([]) == "no cases"


def test_json_round_trips_with_documented_keys_and_counts():
    meta = {"argv": ["--op", "relu"], "backend": np.str_("cpu")}
    doc = load_json(render_json(mixed_results(), "gradcheck", meta))
    assert list(doc) == ["schema", "tool", "meta", "summary", "columns", "results"]
    assert doc["schema"] == SCHEMA_ID and doc["tool"] == "gradcheck"
    assert doc["meta"]["argv"] == ["--op", "relu"] and doc["meta"]["backend"] == "cpu"
    assert {"version", "time"} <= set(doc["meta"])
    assert doc["summary"] == COUNTS
    assert doc["columns"] == {"labels": ["op", "backend", "dtype", "mode"],
                              "metrics": ["checked", "max_abs_err", "max_rel_err",
                                          "worst_index"]}
    first = doc["results"][0]
    assert first == {"case": "relu(type=f32,x=[3,4])", "status": "pass", "op": "relu",
                     "backend": "cpu", "dtype": "f32", "mode": "full", "checked": 12,
                     "max_abs_err": 3e-7, "max_rel_err": 1.5e-6, "message": ""}
    assert [r["status"] for r in doc["results"]] == [r.status for r in mixed_results()]
    assert doc["results"][2]["case"] == XSS


def test_json_non_finite_floats_are_strings_and_the_text_is_strict_json():
    text = render_json(mixed_results(), "gradcheck")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    bad = load_json(text)["results"][1]
    assert bad["max_abs_err"] == "NaN" and bad["max_rel_err"] == "Infinity"
    assert math.isnan(float(bad["max_abs_err"])) and float(bad["max_rel_err"]) == math.inf
    assert bad["worst_index"] == [1, 2]
    neg = render_json([Result("t", "n", "pass", {"e": np.float64(-np.inf),
                                                  "a": np.array([1.0, np.nan])})], "t")
    assert load_json(neg)["results"][0]["e"] == "-Infinity"
    assert load_json(neg)["results"][0]["a"] == [1.0, "NaN"]


def test_json_keys_that_clash_are_prefixed():
    r = Result("t", "c", "pass", {"status": 1, "op": 2.0}, labels={"op": "relu",
                                                                   "message": "m"})
    obj = load_json(render_json([r], "t"))["results"][0]
    assert obj["status"] == "pass" and obj["metric_status"] == 1
    assert obj["op"] == "relu" and obj["metric_op"] == 2.0 and obj["label_message"] == "m"


test_load_json_rejects_other_documents = refusal_test(load_json, SchemaError, [
    ("not json", "not JSON"),
    ("[]", "not an object"),
    ('{"schema": "other/1"}', "schema is 'other/1'"),
    ('{"schema": "gradverify.results/1", "tool": "t"}', "'meta'"),
])


def test_load_json_rejects_a_bad_status_and_a_wrong_total():
    doc = json.loads(render_json(mixed_results(), "gradcheck"))
    doc["results"][0]["status"] = "ok"
    with pytest.raises(SchemaError, match="status 'ok'"):
        load_json(json.dumps(doc))
    doc = json.loads(render_json(mixed_results(), "gradcheck"))
    doc["summary"]["total"] = 5
    with pytest.raises(SchemaError, match="total"):
        load_json(json.dumps(doc))


def test_junit_parses_with_the_right_counts_and_elements():
    text = render_junit(mixed_results(), "gradcheck", meta={"time": "2025-01-01T00:00:00Z"})
    root = ET.fromstring(text.encode())
    suite = root.find("testsuite")
    for el in (root, suite):
        assert (el.get("tests"), el.get("failures"), el.get("errors"), el.get("skipped")) \
            == ("6", "2", "1", "2")
    assert suite.get("timestamp") == "2025-01-01T00:00:00Z"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [r.name for r in mixed_results()]
    assert [c.get("classname") for c in cases] == ["relu", "abs", "div", "conv_2d", "argmax",
                                                   "gguf_op"]
    assert cases[0].find("failure") is None and cases[0].find("skipped") is None
    failure = cases[1].find("failure")
    assert failure.get("message").startswith("x: 1/5 off") and "<2>" in failure.text
    assert cases[3].find("error").get("message") == "ShapeError: conv_2d: [1,2] vs [3]"
    assert "second line" in cases[3].find("error").text
    assert cases[4].find("skipped").get("message") == "no gradient: integer output"
    assert cases[5].find("skipped").get("message") == "unsupported"
    props = {p.get("name"): p.get("value") for p in cases[0].iter("property")}
    assert props["op"] == "relu" and props["max_abs_err"] == "3e-07"


def test_junit_classname_falls_back_to_the_tool_and_control_characters_are_escaped():
    r = Result("optcheck", "adam\x00\x1b[31m", "error", message="bad \x07 bell")
    case = ET.fromstring(render_junit([r], "optcheck").encode()).find("testsuite/testcase")
    assert case.get("classname") == "optcheck" and case.get("name") == "adam\\x00\\x1b[31m"
    assert case.find("error").get("message") == "bad \\x07 bell"


def test_html_is_self_contained_escaped_and_coloured():
    page = render_html(mixed_results(), "gradcheck <report>", meta={"argv": ["a<b"]})
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert XSS not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "gradcheck &lt;report&gt;" in page and "a&lt;b" in page and "a &amp; b" in page
    assert "numerical &lt;2&gt;" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<link" not in page and "src=" not in page
    for status in ("pass", "fail", "error", "skip", "unsupported"):
        assert f'class="status status-{status}"' in page
    assert "td.status-pass { background: #2e7d32; }" in page
    assert "td.status-fail { background: #c62828; }" in page
    assert "1 passed" in page and "2 failed" in page


def test_html_plots_the_errors_on_a_log_scale():
    page = render_html(mixed_results(), "r")
    assert page.count("<svg") == 2  # max_abs_err and max_rel_err
    assert "max_abs_err per case (log scale)" in page and "NaN/Inf" in page
    svg = page[page.index("<svg"):page.index("</svg>") + 6]
    ET.fromstring(svg)  # well-formed, escaped titles included
    assert "1e-7" in svg and "&lt;script&gt;" in svg
    no_errors = [Result("t", "a", "pass", {"loss": 0.5}), Result("t", "b", "skip")]
    assert "<svg" not in render_html(no_errors, "r")
    assert "no cases" in render_html([], "empty")


CRASH = Result("gradcheck", "pool_2d(type=f32,x=[1,1,4,4])", "crash",
               {"repro": "gradcheck --engine ggml --op pool_2d -k 'pool_2d(type=f32)'"},
               "crash: worker killed by SIGABRT (signal 6) while running vjp; stderr: "
               "ggml.c:12: GGML_ASSERT(<cond>) failed",
               {"op": "pool_2d", "engine": "ggml", "backend": "cpu"})


def test_crash_is_a_failure_with_its_own_word():
    assert not CRASH.ok and exit_status([CRASH]) == 1 and exit_status(mixed_results()[:1]) == 0
    assert summary_line([*mixed_results(), CRASH]) == \
        "1 passed, 2 failed, 1 errors, 1 crashed, 1 skipped, 1 unsupported"


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_renders_a_crash(fmt):
    text = render([*mixed_results(), CRASH], fmt, "gradcheck", verbose=True)
    if fmt in ("plain", "github"):
        row = next(line for line in text.splitlines() if line.lstrip("| ").startswith("pool_2d"))
        assert "CRASH" in row and "gradcheck --engine ggml --op pool_2d" in row
        assert "1 crashed" in text
        if fmt == "plain":  # compact: the repro command in the failures, not the row
            compact = render([*mixed_results(), CRASH], fmt, "gradcheck")
            assert "CRASH pool_2d(type=f32,x=[1,1,4,4])\n" in compact
            assert "gradcheck --engine ggml --op pool_2d" in compact and "1 crashed" in compact
    elif fmt == "json":
        doc = load_json(text)
        assert doc["summary"]["crashed"] == 1 and doc["summary"]["total"] == 7
        assert doc["results"][-1]["status"] == "crash"
        assert doc["results"][-1]["repro"].startswith("gradcheck --engine ggml")
    elif fmt == "junit":
        suite = ET.fromstring(text.encode()).find("testsuite")
        assert (suite.get("failures"), suite.get("errors")) == ("2", "2")
        error = suite.findall("testcase")[-1].find("error")
        assert error.get("type") == "crash" and "SIGABRT" in error.get("message")
        assert "GGML_ASSERT(<cond>)" in error.text
    else:
        assert 'class="status status-crash"' in text and "1 crashed" in text
        assert "td.status-crash { background: #6a1b9a; }" in text
        assert "GGML_ASSERT(&lt;cond&gt;)" in text


def test_load_json_accepts_a_document_from_before_the_crash_status():
    doc = json.loads(render_json(mixed_results(), "gradcheck"))
    del doc["summary"]["crashed"]
    assert load_json(json.dumps(doc))["summary"]["total"] == 6


def test_format_for_path():
    assert format_for_path("out/report.JSON") == "json"
    assert format_for_path("r.xml") == "junit" and format_for_path("r.html") == "html"
    assert format_for_path("r.md") == "github" and format_for_path("r") == "plain"


def test_write_atomic_writes_and_replaces(tmp_path):
    path = tmp_path / "report.json"
    write_atomic(path, "first ü\n")
    write_atomic(str(path), "second\n")
    assert path.read_text(encoding="utf-8") == "second\n"
    assert os.listdir(tmp_path) == ["report.json"]


def test_write_atomic_leaves_the_old_file_when_replacing_fails(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    path.write_text("old report")

    def fail_replace(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OutputError, match="Permission denied") as exc:
        write_atomic(path, "new report")
    assert exc.value.path == str(path)
    assert path.read_text() == "old report"
    assert os.listdir(tmp_path) == ["report.html"]  # no temporary file left behind


def test_write_atomic_missing_directory_or_a_directory_is_an_output_error(tmp_path):
    missing = tmp_path / "no" / "such" / "report.json"
    with pytest.raises(OutputError, match="does not exist") as exc:
        write_atomic(missing, "{}")
    assert str(missing) in str(exc.value)
    with pytest.raises(OutputError, match="is a directory"):
        write_atomic(tmp_path, "{}")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions and a non-root user")
def test_write_atomic_unwritable_directory_is_an_output_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="cannot write"):
            write_atomic(locked / "r.txt", "x")
    finally:
        locked.chmod(0o700)


def test_write_atomic_temporary_file_refused_is_an_output_error(tmp_path, monkeypatch):
    real_open = os.open

    def refuse(path, flags, *args, **kwargs):
        if flags & os.O_EXCL:        # the temporary file beside the target
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(OutputError, match="cannot write .*r.txt: directory .* is not writable"):
        write_atomic(tmp_path / "r.txt", "x")
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_write_atomic_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.stat().st_mode & 0o777 == 0o640
    fresh = tmp_path / "fresh.txt"
    write_atomic(fresh, "x")
    assert fresh.stat().st_mode & 0o777 != 0o600  # not mkstemp's private mode
