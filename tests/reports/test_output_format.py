"""--output's extension picks the report's format (.json, .html/.htm, .xml, .md, .txt;
anything else: plain), and an explicit --format that contradicts it is refused in one
line."""

from __future__ import annotations

import pytest

from reports.output import EXTENSION_FORMATS, names_no_format, report_format


@pytest.mark.parametrize(("name", "fmt"), [("r.json", "json"), ("r.html", "html"),
                                           ("R.HTM", "html"), ("r.xml", "junit"),
                                           ("r.md", "github"), ("r.txt", "plain"),
                                           ("r.log", "plain"), ("report", "plain")])
def test_the_extension_names_the_format(name, fmt):
    assert report_format(None, name) == fmt
    assert report_format(fmt, name) == fmt            # the same format said twice is fine


def test_no_output_is_plain_unless_told():
    assert report_format(None) == "plain" and report_format("json") == "json"


def test_an_unknown_extension_takes_any_format():
    for fmt in set(EXTENSION_FORMATS.values()):
        assert report_format(fmt, "results.out") == fmt
    assert names_no_format("r.log") and names_no_format("report")
    assert not names_no_format("r.json") and not names_no_format(None)


def test_a_contradicting_format_is_one_line_naming_both():
    with pytest.raises(ValueError) as exc:
        report_format("plain", "r.html")
    assert str(exc.value) == "--format plain contradicts --output r.html (html); drop one"
    with pytest.raises(ValueError, match=r"--format json contradicts --output 'a\\nb.xml' "
                                         r"\(junit\)"):
        report_format("json", "a\nb.xml")
