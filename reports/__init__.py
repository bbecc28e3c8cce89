"""Result records shared by gradcheck, optcheck and the MNIST run, and their renderings:
plain and Markdown tables, HTML with plots, JSON (the stable machine interface) and JUnit
XML. `render(results, fmt, tool)` picks one; `write_atomic(path, text)` writes it; `emit`
is the shared tail of the command line tools (render, write, exit status)."""

from reports.html_report import render_html
from reports.json_report import SCHEMA_ID, SchemaError, load_json, render_json
from reports.junit import render_junit
from reports.output import (
    FORMATS,
    OutputError,
    emit,
    first_unwritable,
    format_for_path,
    render,
    write_atomic,
)
from reports.record import STATUSES, Result, exit_status, summarize
from reports.table import render_grouped, render_table, summary_line

__all__ = [
    "FORMATS",
    "SCHEMA_ID",
    "STATUSES",
    "OutputError",
    "Result",
    "SchemaError",
    "emit",
    "exit_status",
    "first_unwritable",
    "format_for_path",
    "load_json",
    "render",
    "render_grouped",
    "render_html",
    "render_json",
    "render_junit",
    "render_table",
    "summarize",
    "summary_line",
    "write_atomic",
]
