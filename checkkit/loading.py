"""Loading the engine (or optimizer) under test by name: a built-in one from a table, or the
user's own as `module:attribute`, with every failure a one-line usage error.

    load_attribute("mypkg.adapter:MyAdapter", known)   # the class, imported
    make_adapter("mypkg.adapter:MyAdapter", known, options, required=("name", "vjp"))

A user's module, constructor or property may raise anything (sys.exit and BaseExceptions of
its own included): each becomes an AdapterError naming the engine and what it raised; only
the user's own Ctrl-C goes on up (checkkit.raised). A `module:attribute` is imported from
the current directory, as `python -m` would, or from $GRADVERIFY_ADAPTER_DIR in the
processes of a distributed run, which start in an empty directory of their own
(checkkit.sweep).

An adapter made here carries an AdapterSpec: its name, options and the `module:attribute`
of the function that makes it again; specs travel to worker processes (checkkit.worker),
live adapters do not.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

from checkkit.raised import SignalWatch, described

# the directory a `module:attr` adapter is imported from, in processes that do not start in
# it (the distributed run's, checkkit.sweep)
ADAPTER_DIR_VARIABLE = "GRADVERIFY_ADAPTER_DIR"


class AdapterError(Exception):
    """An engine could not be set up (library missing, wrong version, missing symbol, a
    module that does not import): a usage error, exit status 2, reported before any case
    runs."""


class Unsupported(Exception):
    """Raised by an adapter for a case it cannot take in the way asked (gradcheck's
    forward mode and second order, gradcheck.adapters.base): the case's row is
    `unsupported`, with this message as the reason; across a worker process too
    (checkkit.isolated)."""


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """How to make an adapter: its name, its options as sorted (key, value) pairs, and the
    `module:attribute` of the function that makes an adapter from a name and options (the
    tool's get_adapter); picklable when the options are."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()
    maker: str = "gradcheck.adapters:get_adapter"

    @classmethod
    def of(cls, name: str, options: dict, maker: str = "gradcheck.adapters:get_adapter"):
        return cls(name, tuple(sorted(options.items())), maker)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.options)

    def build(self):
        module, _, attribute = self.maker.partition(":")
        return getattr(importlib.import_module(module), attribute)(self.name, **self.kwargs)


def importable_from_cwd() -> None:
    """As `python -m` does: a user's adapter module in the current directory imports (a
    console script's sys.path holds its own directory instead). Worker processes inherit
    the parent's sys.path, this entry included. The processes of a distributed run start in
    an empty directory of their own; the user's is in $GRADVERIFY_ADAPTER_DIR, used
    instead."""
    given = os.environ.get(ADAPTER_DIR_VARIABLE)
    if given:
        if given not in sys.path:
            sys.path.insert(0, given)
    elif os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def load_attribute(name: str, known: dict[str, tuple[str, str]], kind: str = "engine"):
    """What `name` names: known[name] = (module, attribute), or `module:attribute` (dots in
    the attribute walk into it), imported. Raises AdapterError in one line."""
    if name in known:
        module_name, attribute = known[name]
    elif ":" in name:
        module_name, _, attribute = name.partition(":")
        if not module_name or not attribute:
            raise AdapterError(f"{kind} {name!r}: expected module:attribute, e.g. "
                               "mypackage.adapter:MyAdapter")
        importable_from_cwd()
    else:
        raise AdapterError(f"unknown {kind} {name!r}; known: {', '.join(known)}, or "
                           "module:attribute for your own adapter")
    with SignalWatch() as watch:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise AdapterError(f"{kind} {name!r}: cannot import {module_name}: {exc}") \
                from exc
        except BaseException as exc:
            watch.reraise(exc)
            raise AdapterError(f"{kind} {name!r}: importing {module_name} raised "
                               f"{described(exc)}") from exc
        obj = module
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise AdapterError(f"{kind} {name!r}: {module_name} has no attribute "
                                   f"{attribute!r}") from None
            except BaseException as exc:    # a module's __getattr__, a property
                watch.reraise(exc)
                raise AdapterError(f"{kind} {name!r}: getting {attribute!r} from "
                                   f"{module_name} raised {described(exc)}") from exc
    return obj


def has(obj, attribute: str) -> bool:
    """hasattr that counts a property raising anything (but the user's Ctrl-C) as missing
    (hasattr lets all but AttributeError through)."""
    with SignalWatch() as watch:
        try:
            getattr(obj, attribute)
        except BaseException as exc:
            watch.reraise(exc)
            return False
    return True


def make_adapter(name: str, known: dict[str, tuple[str, str]], options: dict, *,
                 required: tuple[str, ...], protocol: str, maker: str, kind: str = "engine"):
    """The adapter `name` names (load_attribute): a class or factory, called with `options`
    (one without the method `required[-1]`), or an adapter object as it is; it must have
    every attribute of `required` (else AdapterError naming `protocol`, the class to read).
    It gets `spec`, an AdapterSpec with `maker`, unless it has one of its own."""
    obj = load_attribute(name, known, kind)
    with SignalWatch() as watch:
        try:
            makes = isinstance(obj, type) or (callable(obj) and not has(obj, required[-1]))
            adapter = obj(**options) if makes else obj
        except AdapterError:
            raise
        except BaseException as exc:    # a user's constructor: anything but the user's Ctrl-C
            watch.reraise(exc)
            with_options = f" with options {options}" if options else ""
            raise AdapterError(f"{kind} {name!r}: cannot be set up{with_options}: "
                               f"{described(exc)}") from exc
    if not makes and options:
        raise AdapterError(f"{kind} {name!r} is an adapter object: it takes no options, "
                           f"got {options}")
    missing = [a for a in required if not has(adapter, a)]
    if missing:
        raise AdapterError(f"{kind} {name!r} is not an adapter: {type(adapter).__name__} "
                           f"lacks {', '.join(missing)} (see {protocol})")
    with SignalWatch() as watch:
        try:
            if getattr(adapter, "spec", None) is None:
                adapter.spec = AdapterSpec.of(name, options, maker)
        except BaseException as exc:   # slots, a read-only property: spec_of falls back
            watch.reraise(exc)
    return adapter


def describe(adapter, name: str, kind: str = "engine") -> str:
    """adapter.describe() as a str on one line; AdapterError naming `name` when it raises
    (a user's adapter)."""
    with SignalWatch() as watch:
        try:
            return " ".join(str(adapter.describe()).split())
        except BaseException as exc:
            watch.reraise(exc)
            raise AdapterError(f"{kind} {name!r}: describe() raised {described(exc)}") from exc


def spec_of(adapter, maker: str = "gradcheck.adapters:get_adapter") -> AdapterSpec:
    """The spec that rebuilds `adapter`: the one make_adapter recorded (or the adapter's
    own), else its class by import path, called without options by `maker`."""
    spec = getattr(adapter, "spec", None)
    if isinstance(spec, AdapterSpec):
        return spec
    cls = type(adapter)
    return AdapterSpec(f"{cls.__module__}:{cls.__qualname__}", (), maker)
