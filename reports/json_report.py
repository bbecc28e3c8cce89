"""Results as JSON: the stable machine interface (schema "gradverify.results/1").

    {"schema": "gradverify.results/1",
     "tool": "gradcheck",
     "meta": {"version": "0.1.0", "time": "2025-01-01T12:00:00Z", ...},
     "summary": {"passed": 3, "failed": 1, "errors": 0, "crashed": 0, "skipped": 0,
                 "unsupported": 0, "total": 4},
     "columns": {"labels": ["op", "dtype"], "metrics": ["checked", "max_abs_err"]},
     "results": [{"case": "relu(type=f32,x=[3,4])", "status": "pass", "op": "relu",
                  "dtype": "f32", "checked": 12, "max_abs_err": 1.2e-08, "message": ""}]}

A status is one of pass, fail, error, crash, skip, unsupported, vacuous. "crashed" joined
the summary with the crash status, "vacuous" with the vacuous one; documents written before
them lack those keys and still load.

Each result object holds "case", "status", its labels and its metrics flattened (labels
first), and "message". A label whose key is already taken ("case", "status", "message") is
written as "label_<key>"; a metric whose key is taken (those three or a label of the same
result) as "metric_<key>". "columns" lists the flattened keys of labels and metrics, in
first-seen order over all results.

Values: numpy scalars become numbers (float32 by its shortest decimal form), tuples and
arrays lists, anything else without a JSON form its str(). Non-finite floats, which JSON
cannot represent, are the strings "NaN", "Infinity" and "-Infinity": float(s) in Python and
Number(s) in JavaScript read them back.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from importlib import metadata
from numbers import Integral, Real

import numpy as np

from reports.record import STATUSES, summarize

SCHEMA_ID = "gradverify.results/1"
RESERVED_KEYS = ("case", "status", "message")
SUMMARY_KEYS = ("passed", "failed", "errors", "crashed", "skipped", "unsupported", "vacuous",
                "total")
OPTIONAL_SUMMARY_KEYS = ("crashed", "vacuous")   # absent from documents older than them


class SchemaError(ValueError):
    """A JSON text that is not a results document of schema SCHEMA_ID."""


def jsonable(v):
    """`v` as plain JSON data (see the module docstring for the rules)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.floating) and v.dtype.itemsize < 8:
        return jsonable(float(str(v)))  # float32 3e-7 as 3e-07, not 3.000000106112566e-07
    if isinstance(v, np.generic):
        return jsonable(v.item())
    if isinstance(v, Integral):
        return int(v)
    if isinstance(v, Real):
        v = float(v)
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, np.ndarray):
        return jsonable(v.tolist())
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    return str(v)


def _version() -> str:
    try:
        return metadata.version("gradverify")
    except metadata.PackageNotFoundError:
        return "unknown"


def default_meta() -> dict:
    """{"version": the installed gradverify version, "time": now, UTC, ISO 8601}."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {"version": _version(), "time": now.isoformat().replace("+00:00", "Z")}


def _label_key(k) -> str:
    return f"label_{k}" if k in RESERVED_KEYS else str(k)


def _metric_key(k, labels) -> str:
    return f"metric_{k}" if k in RESERVED_KEYS or k in labels else str(k)


def result_object(r) -> dict:
    """One result, flattened: case, status, labels, metrics, message."""
    out = {"case": r.name, "status": r.status}
    out.update((_label_key(k), jsonable(v)) for k, v in r.labels.items())
    out.update((_metric_key(k, r.labels), jsonable(v)) for k, v in r.metrics.items())
    out["message"] = r.message
    return out


def render_json(results, tool: str, meta: Mapping | None = None) -> str:
    """The results document (indented, ending with a newline). `meta` entries (e.g.
    argv, backend) are added to, and override, the default version and time."""
    results = list(results)
    label_keys: dict[str, None] = {}
    metric_keys: dict[str, None] = {}
    for r in results:
        label_keys.update(dict.fromkeys(map(_label_key, r.labels)))
        metric_keys.update(dict.fromkeys(_metric_key(k, r.labels) for k in r.metrics))
    doc = {
        "schema": SCHEMA_ID,
        "tool": tool,
        "meta": jsonable({**default_meta(), **(meta or {})}),
        "summary": summarize(results),
        "columns": {"labels": list(label_keys), "metrics": list(metric_keys)},
        "results": [result_object(r) for r in results],
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def _require(cond: bool, what: str):
    if not cond:
        raise SchemaError(f"not a {SCHEMA_ID} document: {what}")


def load_json(text: str | bytes) -> dict:
    """Parse and validate a results document; the dict as written (NaN stays "NaN").
    Raises SchemaError when the text is not JSON, has another schema id, or lacks a key."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SchemaError(f"not JSON: {exc}") from exc
    _require(isinstance(doc, dict), "the top level is not an object")
    schema = doc.get("schema")
    _require(schema == SCHEMA_ID, f"schema is {schema!r}")
    for key, kind in (("tool", str), ("meta", dict), ("summary", dict), ("columns", dict),
                      ("results", list)):
        _require(isinstance(doc.get(key), kind), f"{key!r} missing or not a {kind.__name__}")
    summary = doc["summary"]
    for key in SUMMARY_KEYS:
        if key in OPTIONAL_SUMMARY_KEYS and key not in summary:
            continue
        _require(isinstance(summary.get(key), int), f"summary[{key!r}] missing or not an int")
    for i, obj in enumerate(doc["results"]):
        _require(isinstance(obj, dict), f"results[{i}] is not an object")
        _require(isinstance(obj.get("case"), str), f"results[{i}] has no 'case' string")
        _require(obj.get("status") in STATUSES,
                 f"results[{i}] status {obj.get('status')!r} is not one of {STATUSES}")
        _require(isinstance(obj.get("message"), str), f"results[{i}] has no 'message' string")
    _require(summary["total"] == len(doc["results"]),
             f"summary total {summary['total']} != {len(doc['results'])} results")
    return doc
