"""Command lines generated from each tool's own parser: its options, choices, nargs and types
(argparse actions, read from build_parser()), with valid and hostile values.

    argv = draw(argvs("mnist-train"))    # e.g. ["--arch", "fc", "--lr", "nan", ...]

Every command line starts from a cheap base (one small op, few steps, the tiny IDX set, one
epoch), to which 0 to 4 edits are made: an option set to a drawn value, a base option
dropped, a junk token added. Values: a choice, a small valid value, or a hostile one (empty,
huge, negative, 5,000-digit numbers, NaN, odd Unicode, paths to FIFOs, directories, link
loops, missing or read-only files, mutated files). Paths are written with the placeholders
{user} (the directory of files the test owns, which must not change) and {scratch} (where
the tools may write); the test substitutes them.

Values that would make a valid run long (many epochs, steps or random cases, --all, the
scale tier, --workers N, which starts pytest-xdist) are left out: a hang is then a defect.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from hypothesis import strategies as st

BIG_INTS = ("9223372036854775807", "9223372036854775808", "18446744073709551616", "9" * 4300)
INTS = ("0", "-1", "-0", "+1", " 1", "1_0", "\u0663", "0x10", "1e3", "1.5", "", "nan",
        "-9223372036854775809", "9" * 5000, "-" + "9" * 5000)
FLOATS = ("nan", "-nan", "inf", "-inf", "infinity", "1e308", "1e309", "-1e309", "0", "-0",
          "1e-320", "", "0x1p3", "1" * 5000, "1e99999", "\u0663", " 1", "1_0", "-1", "2")
TEXTS = ("", " ", "-", "--", "\udcff", "\u00e9", "a" * 5000, "\n", "x\ny", "%s", "{}",
         "../../etc/passwd", "\x1b[31m", "NUL\x01")
JUNK = ("--nosuch", "-x", "--", "-", "---", "--no-progress=1", "-h", "--help", "@args",
        "--=", "extra", "\udcff")

INPUT_FILES = tuple(f"{{user}}/{n}" for n in (
    "model-fc.gguf", "model-cnn.gguf", "graph-mnist.gguf", "graph.gguf", "ckpt-adam.gguf",
    "readonly.gguf", "empty.gguf", "notgguf.txt", "fifo", "loop", "dangling", "dir", "idx",
    "missing.gguf", "mut-truncated.gguf", "mut-count.gguf", "mut-type.gguf",
    "mut-ne.gguf", "mut-offset.gguf", "mut-graph-srcs.gguf")) + (
    "", "/dev/null", "/dev/zero", "/proc/self/status", "-", "{user}/" + "a" * 5000,
    "{user}/\udcff.gguf", "{user}/dir/")
INPUT_DIRS = tuple(f"{{user}}/{n}" for n in (
    "idx", "idx-gz", "idx-bad", "idx-fifo", "idx-bomb", "idx-mismatch", "idx-labels",
    "dir", "model-fc.gguf", "fifo", "loop", "dangling", "missing", "badlib")) + (
    "", "/dev/null", "/proc", "{user}/" + "d" * 300)
OUTPUTS = tuple(f"{{scratch}}/{n}" for n in (
    "out.gguf", "out.json", "out.html", "out.xml", "out.txt", "out.md", "out", "a\nb.json",
    "x" * 300, "missing/out.json", "", ".")) + tuple(f"{{user}}/{n}" for n in (
    "readonly.gguf", "readonly.json", "dir", "loop", "idx", "fifo-dir/")) + (
    "", "/proc/version", "/dev/null", "{scratch}")


@dataclasses.dataclass(frozen=True)
class Spec:
    """How to fuzz one tool: its parser, the base command line (pairs; None: a flag), the
    options never generated, the values per dest (valid ones first), the dests that stay."""
    parser: Callable[[], argparse.ArgumentParser]
    base: tuple[tuple[str, str | None], ...]
    excluded: frozenset[str] = frozenset()
    values: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    kept: frozenset[str] = frozenset()


def _gradcheck_parser():
    from gradcheck.cli import build_parser
    return build_parser()


def _optcheck_parser():
    from optcheck.cli import build_parser
    return build_parser()


def _mnist_parser(name):
    def build():
        from mnist_target.cli import build_command_parser
        return build_command_parser(name)
    return build


_REPROS = ("relu(type=f64,x=[3,4])", "Sample(op='relu')",
           "Sample(op='relu', inputs=(InputSpec(name='x', shape=(3,)),), dtype='f64')",
           "Sample(op='relu', inputs=(InputSpec(name='x', shape=(99999999999,)),))",
           "__import__('os').system('true')", "Sample(" * 3000, "x" * 20_000, "")
_ENGINES = ("engine", "torch", "ggml", "nosuch.module:Adapter", "engine:nosuch",
            "os.path:join", "math:pi", ":", "a:b:c", "")
_TRAINING = {
    "epochs": ("1", "2", "0", "-1", "", "1.5", "9" * 5000, "-" + "9" * 30),
    "batch_logical": ("10", "20", "5", *INTS, *BIG_INTS),
    "batch_physical": ("10", "5", "3", *INTS, *BIG_INTS),
    "limit": ("30", "20", "40", "1", *INTS, *BIG_INTS),
    "threads": ("1", "2", *INTS, "4096", "1000000", *BIG_INTS),
    "data": INPUT_DIRS, "out": OUTPUTS, "graph_out": OUTPUTS, "output": OUTPUTS,
    "ggml_lib": INPUT_DIRS,
}
SPECS = {
    "gradcheck": Spec(
        _gradcheck_parser, (("--op", "relu"), ("--dtype", "f64"), ("--no-progress", None)),
        excluded=frozenset({"all", "self_test"}),
        values={"op": ("relu", "neg", "sqr", "abs", "nosuch", "relu,neg", *TEXTS),
                "tier": ("fast", "scale!", "", "all!"),
                "random": ("0", "1", "2", *INTS, *BIG_INTS),
                "repro": _REPROS, "engine": _ENGINES,
                "inject": ("scale:1.01", "scale:nan", "scale:1e309", "scale:", "scale",
                           "relu_grad_scaled", "nosuch", *TEXTS),
                "filter": ("x=[3", "cotangent=sliced", *TEXTS),
                "ggml_threads": ("1", "2", *INTS, *BIG_INTS),
                "case_timeout": ("5", "30", *FLOATS),
                "workers": ("", "x", "1.5", "nan"), "ggml_lib": INPUT_DIRS,
                "output": OUTPUTS}),
    "optcheck": Spec(
        _optcheck_parser, (("--opt", "sgd"), ("--steps", "2"), ("--family", "closed-form"),
                           ("--dtype", "f64"), ("--no-progress", None)),
        excluded=frozenset({"self_test"}),
        values={"opt": ("sgd", "adam", "adamw", "all!", *TEXTS[:4]),
                "steps": ("2", "3", "1", *INTS, *BIG_INTS),
                "betas": ("0.9,0.999", "0.9,0.99", "nan,0.9", "1,1", "0.9", ",", "", "1,2,3",
                          "inf,-inf"),
                "workers": ("", "x", "1.5", "nan"), "output": OUTPUTS,
                "lr": ("0.01", "0.1", *FLOATS), "eps": ("1e-8", *FLOATS),
                "weight_decay": ("0.01", "0", *FLOATS), "momentum": ("0.9", *FLOATS),
                "dampening": ("0.1", *FLOATS)}),
    "mnist-train": Spec(
        _mnist_parser("train"),
        (("--arch", "fc"), ("--out", "{scratch}/model.gguf"), ("--data", "{user}/idx"),
         ("--epochs", "1"), ("--batch-logical", "10"), ("--batch-physical", "10"),
         ("--no-progress", None)),
        values=_TRAINING, kept=frozenset({"data", "epochs"})),
    "mnist-eval": Spec(
        _mnist_parser("eval"), (("", "{user}/model-cnn.gguf"), ("--data", "{user}/idx")),
        values={**_TRAINING, "file": INPUT_FILES}),
    "mnist-regress": Spec(
        _mnist_parser("regress"),
        (("--arch", "fc"), ("--data", "{user}/idx"), ("--epochs", "1"),
         ("--batch-logical", "10"), ("--batch-physical", "10"), ("--no-progress", None)),
        values={**_TRAINING, "arch": ("fc", "cnn", "all", *TEXTS[:3]),
                "engine": ("engine", "ggml", "engine,ggml", "torch", ",", "", "engine,,")},
        kept=frozenset({"data", "epochs"})),
}


def _actions(parser: argparse.ArgumentParser, spec: Spec) -> list[argparse.Action]:
    return [a for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and a.dest not in spec.excluded]


def _value(action: argparse.Action, spec: Spec):
    """A value for `action`: its choices or the spec's values (first the valid ones), or, by
    its type, hostile numbers or text."""
    if action.nargs == 0:
        return st.none()
    if action.dest in spec.values:
        return st.sampled_from(spec.values[action.dest])
    hostile = {int: INTS + BIG_INTS, float: FLOATS}.get(action.type, TEXTS)
    if action.choices:
        choices = [str(c) for c in action.choices]     # as a command line holds them
        return st.one_of(st.sampled_from(choices), st.sampled_from(hostile))
    return st.sampled_from(hostile)


def _flag(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else ""


@st.composite
def argvs(draw, tool: str) -> list[str]:
    spec = SPECS[tool]
    actions = _actions(spec.parser(), spec)
    entries = [list(pair) for pair in spec.base]
    for _ in range(draw(st.integers(0, 4))):
        edit = draw(st.sampled_from(("set", "set", "set", "drop", "junk")))
        if edit == "set":
            action = draw(st.sampled_from(actions))
            flag, value = _flag(action), draw(_value(action, spec))
            if action.option_strings:
                flag = draw(st.sampled_from(action.option_strings))
            same = [e for e in entries if e[0] in action.option_strings or
                    (not flag and not e[0])]
            if same and not isinstance(action, argparse._AppendAction) and draw(st.booleans()):
                same[0][1] = value
            else:
                entries.append([flag, value])
        elif edit == "drop":
            keep = {_flag(a) for a in actions if a.dest in spec.kept}
            droppable = [e for e in entries if e[0] not in keep]
            if droppable:
                entries.remove(draw(st.sampled_from(droppable)))
        else:
            entries.append([draw(st.sampled_from(JUNK)), None])
    if draw(st.booleans()):
        entries = draw(st.permutations(entries))
    argv = []
    for flag, value in entries:
        if value is None:
            argv.append(flag)
        elif not flag:
            argv.append(value)
        elif draw(st.integers(0, 4)) == 0:
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, value]
    return argv
