"""Results as JUnit XML, for CI systems that read test reports.

    <testsuites name=... tests= failures= errors= skipped=>
      <testsuite name=... tests= failures= errors= skipped= timestamp=>
        <properties>    the meta entries (version, argv, ...)
        <testcase classname="<label op, else the tool>" name="<case>">
          <properties>  the result's labels and metrics
          <failure message=... type="fail">   for fail
          <error message=... type="error">    for error
          <error message=... type="crash">    for crash (counted among the errors)
          <skipped message=...>               for skip and unsupported

Built with xml.etree.ElementTree, so markup in names and messages is escaped; characters
that XML 1.0 cannot hold at all (most control characters) are written as \\xNN.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

import numpy as np

from reports.record import summarize
from reports.table import format_value

_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _x(v) -> str:
    """str(v), with characters that XML cannot hold replaced by \\xNN escapes."""
    return _ILLEGAL_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(v))


def _value(v) -> str:
    """A property value: floats in full (repr), the rest as the tables show them."""
    if isinstance(v, (float, np.floating)):
        return repr(float(str(v)))
    return format_value(v)


def _properties(parent: ET.Element, items: list[tuple], words: bool = False) -> None:
    """<properties> of (name, value) pairs; `words`: lists as space-separated words (argv)."""
    if not items:
        return
    props = ET.SubElement(parent, "properties")
    for k, v in items:
        text = " ".join(map(str, v)) if words and isinstance(v, (list, tuple)) else _value(v)
        ET.SubElement(props, "property", name=_x(k), value=_x(text))


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def render_junit(results, suite_name: str, meta: Mapping | None = None) -> str:
    """A JUnit XML document (with declaration, ending with a newline): one testsuite named
    `suite_name`, one testcase per result."""
    results = list(results)
    c = summarize(results)
    counts = {"tests": str(c["total"]), "failures": str(c["failed"]),
              "errors": str(c["errors"] + c["crashed"]),
              "skipped": str(c["skipped"] + c["unsupported"] + c["vacuous"])}
    root = ET.Element("testsuites", name=_x(suite_name), **counts)
    suite = ET.SubElement(root, "testsuite", name=_x(suite_name), **counts)
    meta = dict(meta or {})
    if "time" in meta:
        suite.set("timestamp", _x(meta["time"]))
    _properties(suite, list(meta.items()), words=True)
    for r in results:
        classname = r.labels.get("op") or r.tool
        case = ET.SubElement(suite, "testcase", classname=_x(classname), name=_x(r.name))
        _properties(case, [*r.labels.items(), *r.metrics.items()])
        message = _x(r.message)
        if r.status == "fail":
            el = ET.SubElement(case, "failure", message=_first_line(message) or "failed",
                               type="fail")
            el.text = message
        elif r.status in ("error", "crash"):
            el = ET.SubElement(case, "error", message=_first_line(message) or r.status,
                               type=r.status)
            el.text = message
        elif r.status in ("skip", "unsupported", "vacuous"):
            reason = message or ("skipped" if r.status == "skip" else "")
            if r.status != "skip" and not reason.startswith(r.status):
                reason = f"{r.status}: {reason}" if reason else r.status
            ET.SubElement(case, "skipped", message=reason)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
