"""One request object per tool: a frozen dataclass of the tool's options, which the command
line, `--workers N`, the pytest plugin and the Python API all build and run.

A request validates itself once (`problem`, the one place of every usage rule), makes its
Plan (checkkit.jobs: the jobs in the report's order) and runs it. Its fields are the
options: the pytest plugin's `--TOOL-NAME` options are made from them (`plugin_options`),
read back into a request (`from_plugin`), and written out again for a distributed run
(`plugin_args`), so no option table is written twice. A field's metadata holds its help
text and metavar; `plugin=False` keeps it off the plugin (the command line's actions, such
as gradcheck's --self-test, which the plugin does not run).

    field(default, doc="...", metavar="N")               # an option of both front ends
    field(default, doc="...", plugin=False)              # the command line's only

The usage messages name an option as the front end spells it: `flag("ggml_lib")` is
`--ggml-lib` on the command line and `--gradcheck-ggml-lib` in the plugin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar


def field(default: Any = None, *, doc: str, metavar: str | None = None,
          kind: type | None = None, plugin: bool = True) -> Any:
    """A request field: its default, and what the plugin's option says of it: `doc`, its
    help; `kind`, the type of its value where the default (None) does not say."""
    meta = {"help": doc, "metavar": metavar, "type": kind, "plugin": plugin}
    if isinstance(default, (list, dict, set)):
        raise TypeError("a request field's default must be immutable (a tuple)")
    return dataclasses.field(default=default, metadata=meta)


def cli_flag(name: str) -> str:
    """The command line's spelling of field `name`: `--ggml-lib`."""
    return "--" + name.replace("_", "-")


class Request:
    """The base of a tool's request (a frozen dataclass). A subclass sets `tool` and
    `plugin` (the module of its pytest plugin) and defines `problem(flag)` and `plan()`."""

    tool: ClassVar[str]
    plugin: ClassVar[str]

    def problem(self, flag: Callable[[str], str] = cli_flag) -> str | None:
        """What makes this request unusable, in one line naming options by `flag`; None
        when nothing does."""
        raise NotImplementedError

    def ahead(self) -> Request:
        """The request a compile-ahead helper runs (checkkit.ahead): its jobs must be this
        request's, in order, and compile the same kernels; their rows are thrown away, so
        what they check need not be. This request itself, unless a tool knows a cheaper
        one."""
        return self

    def plugin_flag(self, name: str) -> str:
        """The plugin's spelling of field `name`: `--gradcheck-ggml-lib`."""
        return f"--{self.tool}-{name.replace('_', '-')}"

    @classmethod
    def plugin_fields(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.metadata.get("plugin", True)]

    @classmethod
    def plugin_options(cls) -> list[tuple[str, dict]]:
        """(option name after --TOOL-, argparse keywords) per plugin field, its default the
        field's: a tuple field is repeatable, a bool one a flag."""
        options = []
        for f in cls.plugin_fields():
            kwargs: dict[str, Any] = {"help": f.metadata["help"]}
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
            if isinstance(f.default, tuple):
                kwargs["action"] = "append"
            elif isinstance(f.default, bool):
                kwargs["action"] = "store_true"
            else:
                kwargs["default"] = f.default
                kind = f.metadata.get("type") or (
                    type(f.default) if isinstance(f.default, (int, float)) else None)
                if kind is not None:
                    kwargs["type"] = kind
            options.append((f.name.replace("_", "-"), kwargs))
        return options

    @classmethod
    def from_plugin(cls, getoption: Callable[[str], Any]):
        """The request of the plugin's options; `getoption(field name)` reads one."""
        values = {}
        for f in cls.plugin_fields():
            value = getoption(f.name)
            values[f.name] = tuple(value or ()) if isinstance(f.default, tuple) else value
        return cls(**values)

    def plugin_args(self) -> list[str]:
        """The plugin's options that make this request again in another process (fields
        left at their default are left out)."""
        args = [f"--{self.tool}"]
        for f in self.plugin_fields():
            value, flag = getattr(self, f.name), self.plugin_flag(f.name)
            if value == f.default:
                continue
            if isinstance(f.default, tuple):
                args += [f"{flag}={v}" for v in value]
            elif isinstance(f.default, bool):
                args.append(flag)
            else:
                args.append(f"{flag}={value}")
        return args
