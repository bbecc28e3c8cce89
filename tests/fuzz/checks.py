"""What every fuzz case must satisfy, for a file given to a loader and for a command line.

    check_load(env, "model", data, changes)     # a valid result or GGUFFormatError, one line
    check_cli(env, "optcheck", argv)            # exit 0, 1 or 2, no traceback, user files kept

A file case passes with a valid result, or the surface's documented error class with a
non-empty one-line message naming the file; anything else (another exception, a refused
checkpoint that changed the params, a hang, the child killed by the memory bound) fails.
A command line passes with exit status 0 or 1 (a verdict), or 2 with exactly one line on
stderr (after the tools' own status lines); never a traceback, a hang or a death, never a
change to the user files, never a file left in the scratch directory that no output option
named. Each failure is also recorded with its input (env.findings) for the summary; with
GRADVERIFY_FUZZ_SURVEY=1 the search goes on after one (to list every distinct failure).
"""

from __future__ import annotations

import os
import re
import shutil

from hypothesis import HealthCheck, settings

from tests.fuzz.userfiles import changes, fingerprint

LOAD_TIMEOUT, CLI_TIMEOUT = 30.0, 90.0
GGUF_ERROR = "engine.gguf_io.GGUFFormatError"
EXPECTED = {"gguf": GGUF_ERROR, "model": GGUF_ERROR, "graph": GGUF_ERROR,
            "checkpoint": GGUF_ERROR, "idx_images": "mnist_target.pixels.MnistDataError",
            "idx_labels": "mnist_target.pixels.MnistDataError",
            "idx_dir": "mnist_target.pixels.MnistDataError"}
# stderr lines a tool prints on its way, before an error; not the error line
STATUS_LINES = re.compile(r"^(gradcheck: engine under test: |mnist(-train|-eval|-regress)?: "
                          r"(data from |training |wrote |warning: )|gradcheck: warning: |"
                          r"optcheck: warning: )")
OUTPUT_DESTS = ("--output", "--out", "--graph-out")


def fuzz_settings(short: int, long: int):
    """Hypothesis settings: `short` examples in the default run, `long` under the profile
    "fuzz" (HYPOTHESIS_PROFILE=fuzz, tox -e fuzz)."""
    big = settings.get_current_profile_name() == "fuzz"
    return settings(max_examples=long if big else short, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


class FuzzFailure(AssertionError):
    """A case that broke the promise; recorded in env.findings before it is raised."""


def _fail(env, surface: str, problem: str, shown) -> None:
    def plain(text: str) -> str:
        for path, name in ((env.user, "{user}"), (env.scratch, "{scratch}"),
                           (env.cases, "{cases}")):
            text = text.replace(path, name)
        return text
    env.findings.append((surface, plain(problem), plain(repr(shown))[:600]))
    raise FuzzFailure(f"{surface}: {problem}\ninput: {shown!r}"[:4000])


def _surveyed(check):
    """GRADVERIFY_FUZZ_SURVEY=1: a failing case is recorded and the search goes on (every
    distinct failure of a surface in one run; the session still fails, see conftest)."""
    def run(env, *args, **kwargs):
        try:
            return check(env, *args, **kwargs)
        except FuzzFailure:
            if not os.environ.get("GRADVERIFY_FUZZ_SURVEY"):
                raise
            return None
    run.__name__, run.__doc__ = check.__name__, check.__doc__
    return run


@_surveyed
def check_load(env, surface: str, data: bytes, mutation, option=None, suffix=".gguf",
               path: str | None = None) -> None:
    """Write `data` (unless `path` is a prepared directory) and load it in the child."""
    env.count(surface)
    if path is None:
        path = os.path.join(env.cases, f"case{suffix}")
        with open(path, "wb") as f:
            f.write(data)
    outcome = env.child.run(("load", surface, path, option), LOAD_TIMEOUT)
    shown = (mutation, option)
    kind = outcome[0]
    if kind == "ok":
        return
    if kind == "error":
        _, classes, message, trace = outcome
        if EXPECTED[surface] not in classes:
            _fail(env, surface, f"raised {classes[0]}: {message[:300]}", (shown, trace[-1500:]))
        if not message.strip() or "\n" in message.strip():
            _fail(env, surface, f"{classes[0]} message is not one line: {message[:300]!r}",
                  shown)
        if os.path.basename(path.rstrip("/")) not in message:
            _fail(env, surface, f"{classes[0]} message does not name the file: "
                                f"{message[:300]!r}", shown)
        return
    if kind == "changed":
        _fail(env, surface, f"a refused checkpoint changed the params: {outcome[1][:300]}",
              shown)
    _fail(env, surface, f"{kind}: {outcome[1:]!r}"[:500], shown)


def _outputs(argv: list[str], scratch: str) -> set[str]:
    """Top-level names in `scratch` that an output option of `argv` may create."""
    names = set()
    for i, token in enumerate(argv):
        flag, _, value = token.partition("=")
        if flag in OUTPUT_DESTS or any(d.startswith(flag) and len(flag) > 3
                                       for d in OUTPUT_DESTS):
            value = value if "=" in token else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.startswith(scratch + os.sep):
                names.add(value[len(scratch) + 1:].split(os.sep)[0])
    return names


@_surveyed
def check_cli(env, tool: str, argv: list[str]) -> int:
    """Run `argv` (placeholders substituted) and check it; its exit status."""
    env.count(f"cli:{tool}")
    argv = [a.replace("{user}", env.user).replace("{scratch}", env.scratch) for a in argv]
    for name in os.listdir(env.scratch):
        path = os.path.join(env.scratch, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) \
            else os.remove(path)
    before = env.user_fingerprint
    outcome = env.child.run(("cli", tool, argv, env.scratch), CLI_TIMEOUT)
    surface = f"cli:{tool}"
    after = fingerprint(env.user_path)
    if after != before:
        env.user_fingerprint = fingerprint(env.user_path)   # report once, then go on
        _fail(env, surface, f"user files changed: {changes(before, after)}", argv)
    if outcome[0] != "done":
        _fail(env, surface, f"{outcome[0]}: {outcome[1]!r}", argv)
    _, rc, stdout, stderr = outcome
    env.count(f"{surface} exit {rc}")
    if "Traceback" in stderr:
        last = [line for line in stderr.splitlines() if line.strip()][-1]
        _fail(env, surface, f"traceback, exit {rc}: {last[:200]}", (argv, stderr[-1500:]))
    if rc not in (0, 1, 2):
        _fail(env, surface, f"exit status {rc}", (argv, stderr[-500:]))
    lines = [line for line in stderr.splitlines() if line.strip() and
             not STATUS_LINES.match(line)]
    if rc == 2 and len(lines) != 1:
        _fail(env, surface, f"exit 2 with {len(lines)} stderr lines (first: "
                            f"{lines[0][:80] if lines else ''!r})", (argv, stderr[-800:]))
    stray = set(os.listdir(env.scratch)) - _outputs(argv, env.scratch)
    if stray:
        _fail(env, surface, f"exit {rc} left files no option named: {sorted(stray)[:5]}", argv)
    return rc
