"""Write errors on every writer of every tool: each output option (gradcheck --output,
optcheck --output, mnist-train --out and --graph-out, mnist-regress --output, the pytest
plugin's --gradcheck-json and --optcheck-json) pointed at a target that cannot be written.

    surface "write:TOOL--OPTION"  (cases counted per writer, like the other surfaces)

Targets: /dev/full (refuses data only when written, after the run), a directory that is gone,
a directory in place of the file, a path under a regular file, an existing read-only file;
each given as it is or through a symlink, absolute or relative to the working directory.
Every one must end with exit status 2 (the plugin: pytest's usage error, 4) and exactly one
line on stderr, after the tools' status lines, that opens with the command's name and
says "cannot write PATH"; never a traceback; an existing file byte for byte as it was,
a directory as it was, and no temporary file left anywhere in the working directory. An
existing writable file is the control: it is replaced by a whole new file that keeps its
mode.

Faults the file system cannot be made to raise on demand are injected in-process (not in
the bounded child): EIO from fsync, EIO from the rename, ENOSPC in the middle of the data,
each on an existing file that must stay byte for byte as it was, for every writer.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.argvs import SPECS
from tests.fuzz.checks import CLI_TIMEOUT, STATUS_LINES, _fail, _surveyed, fuzz_settings
from tests.fuzz.child import main_of
from tests.fuzz.userfiles import changes, fingerprint

pytestmark = pytest.mark.fuzz

# (tool, output option, the suffixes its files may have)
WRITERS = (("gradcheck", "--output", (".json", ".html", ".xml", ".md", ".txt", "")),
           ("optcheck", "--output", (".json", ".xml", ".txt")),
           ("mnist-train", "--out", (".gguf", "")),
           ("mnist-train", "--graph-out", (".gguf",)),
           ("mnist-regress", "--output", (".json", ".html", ".txt")))
KINDS = ("full", "gone", "directory", "under a file", "read-only", "existing")
FAILING = frozenset(KINDS) - {"existing"}
HAS_DEV_FULL = os.path.exists("/dev/full")
# besides the tools' status lines: the progress of training, which may precede a write error
PROGRESS = re.compile(r"^(epoch +\d+:|\S+, seed \d+: |  (engine|ggml|torch) +epoch)")
OLD = b"the previous contents\n"


def _base(tool: str, option: str, workdir: str) -> list[str]:
    """The cheap valid command line of tests.fuzz.argvs, without its outputs."""
    argv = []
    for flag, value in SPECS[tool].base:
        if flag in ("--out", "--output", "--graph-out"):
            continue
        argv += [x for x in (flag, value) if x]
    if tool == "mnist-train" and option != "--out":
        argv += ["--out", os.path.join(workdir, "model.gguf")]
    return argv


def _target(workdir: str, kind: str, suffix: str, via_link: bool, relative: bool) -> str:
    """Make the target of `kind` in `workdir`; the path to give the tool."""
    name = f"out{suffix}"
    real = {"full": "/dev/full", "gone": os.path.join(workdir, "gone", name),
            "directory": os.path.join(workdir, name),
            "under a file": os.path.join(workdir, "file", name),
            "read-only": os.path.join(workdir, name),
            "existing": os.path.join(workdir, name)}[kind]
    if kind == "directory":
        os.mkdir(real)
        with open(os.path.join(real, "keep"), "wb") as f:
            f.write(OLD)
    elif kind == "under a file":
        with open(os.path.join(workdir, "file"), "wb") as f:
            f.write(OLD)
    elif kind in ("read-only", "existing"):
        with open(real, "wb") as f:
            f.write(OLD)
        os.chmod(real, 0o444 if kind == "read-only" else 0o640)
    given_path = real
    if via_link:
        given_path = os.path.join(workdir, f"link{suffix}")
        os.symlink(real, given_path)
    if relative and given_path.startswith(workdir + os.sep):
        given_path = given_path[len(workdir) + 1:]
    return given_path


def _temporaries(workdir: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), workdir)
                  for d, _, names in os.walk(workdir) for n in names if n.endswith(".tmp"))


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()
            and not STATUS_LINES.match(line) and not PROGRESS.match(line)]


def _whole(path: str, tool: str, option: str) -> bool:
    """Whether `path` holds a whole output of `tool`'s `option` (a document, a model)."""
    if option in ("--out", "--graph-out"):
        from engine.gguf_io import load_gguf
        try:
            load_gguf(path)
        except Exception:   # noqa: BLE001  (any failure: not whole)
            return False
        return True
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"{"):      # a JSON report (gradcheck and optcheck write a .json
        try:                       # path in --format, plain by default)
            return json.loads(data).get("schema") == "gradverify.results/1"
        except ValueError:
            return False
    return len(data) > 0 and data != OLD and data.endswith(b"\n")


@_surveyed
def check_writer(env, tool: str, option: str, kind: str, suffix: str, via_link: bool,
                 relative: bool) -> None:
    """Run `tool` with `option` at a target of `kind` in a fresh working directory (in the
    bounded child) and check the promises of the module docstring."""
    surface = f"write:{tool}{option}"
    env.count(surface)
    workdir = os.path.join(env.cases, "writer")
    if os.path.lexists(workdir):
        subprocess.run(["rm", "-rf", workdir], check=True)
    os.mkdir(workdir)
    path = _target(workdir, kind, suffix, via_link, relative)
    argv = [*(a.replace("{user}", env.user) for a in _base(tool, option, workdir)), option,
            path]
    shown = (tool, option, kind, path)
    before = fingerprint(env.user_path)
    inside = {k: v for k, v in fingerprint(workdir).items() if not k.startswith("model.")}
    outcome = env.child.run(("cli", tool, argv, workdir), CLI_TIMEOUT)
    after = fingerprint(env.user_path)
    if after != before:
        env.user_fingerprint = after
        _fail(env, surface, f"user files changed: {changes(before, after)}", shown)
    if outcome[0] != "done":
        _fail(env, surface, f"{outcome[0]}: {outcome[1]!r}"[:300], shown)
    _, rc, _stdout, stderr = outcome
    env.count(f"{surface} exit {rc}")
    if "Traceback" in stderr:
        _fail(env, surface, f"traceback, exit {rc}", (shown, stderr[-1500:]))
    left = _temporaries(workdir)
    if left:
        _fail(env, surface, f"temporary files left behind: {left[:3]}", shown)
    if kind == "existing":
        real = os.path.join(workdir, f"out{suffix}")
        if rc not in (0, 1):
            _fail(env, surface, f"a writable file: exit {rc}", (shown, stderr[-800:]))
        elif not _whole(real, tool, option):
            _fail(env, surface, "a writable file was not replaced by a whole output", shown)
        elif stat.S_IMODE(os.stat(real).st_mode) != 0o640:
            _fail(env, surface, f"the replaced file's mode is "
                                f"{stat.S_IMODE(os.stat(real).st_mode):o}, not 640", shown)
        return
    if rc != 2:
        _fail(env, surface, f"exit {rc}, not 2", (shown, stderr[-800:]))
    lines = _error_lines(stderr)
    if len(lines) != 1:
        _fail(env, surface, f"{len(lines)} error lines, not one", (shown, stderr[-800:]))
    if not lines[0].startswith(f"{tool}: ") or f"cannot write {path}" not in lines[0]:
        _fail(env, surface, f"the line does not name the command and the file: "
                            f"{lines[0][:200]!r}", shown)
    now = {k: v for k, v in fingerprint(workdir).items() if not k.startswith("model.")}
    if now != inside:
        _fail(env, surface, f"the working directory changed: {changes(inside, now)}", shown)


@st.composite
def writer_cases(draw):
    tool, option, suffixes = draw(st.sampled_from(WRITERS))
    kinds = KINDS if HAS_DEV_FULL else KINDS[1:]
    return (tool, option, draw(st.sampled_from(kinds)), draw(st.sampled_from(suffixes)),
            draw(st.booleans()), draw(st.booleans()))


@fuzz_settings(short=10, long=600)
@given(case=writer_cases())
def test_write_errors_on_every_output_option(fuzz_env, case):
    check_writer(fuzz_env, *case)


@pytest.mark.skipif(not HAS_DEV_FULL, reason="needs /dev/full")
@pytest.mark.parametrize("tool, option", [(t, o) for t, o, _ in WRITERS])
def test_a_full_device_after_the_run(fuzz_env, tool, option):
    """The defect of issue 31: a full disk showed only after the run (mnist-train trained,
    then died with a traceback)."""
    check_writer(fuzz_env, tool, option, "full", "", False, False)


# --- faults injected in-process ----------------------------------------------------------

def _inject(monkeypatch, fault: str, target: str) -> None:
    """Make the write of `target` (only) fail with `fault`."""
    import engine.files as files
    base = f".{os.path.basename(target)}."

    def ours(fd_or_path) -> bool:
        name = fd_or_path if isinstance(fd_or_path, str) else \
            os.readlink(f"/proc/self/fd/{fd_or_path}")
        return os.path.basename(name).startswith(base)

    if fault in ("fsync", "replace"):
        real = getattr(os, fault)

        def eio(first, *args, **kwargs):
            if ours(os.fspath(first) if fault == "replace" else first):
                raise OSError(errno.EIO, "Input/output error")
            return real(first, *args, **kwargs)

        monkeypatch.setattr(os, fault, eio)
        return
    create = files._create_temp

    def onto_a_full_device(path, real_target):
        temp, fd = create(path, real_target)
        if real_target != os.path.realpath(target):
            return temp, fd
        os.close(fd)     # the temporary file exists; its data goes to /dev/full instead
        return temp, os.open("/dev/full", os.O_WRONLY)

    monkeypatch.setattr(files, "_create_temp", onto_a_full_device)


FAULTS = {"fsync": "Input/output error", "replace": "Input/output error",
          "data": "No space left on device"}


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "data" or HAS_DEV_FULL])
@pytest.mark.parametrize("tool, option", [(t, o) for t, o, _ in WRITERS])
def test_a_fault_at_write_time_keeps_the_previous_file(fuzz_env, tmp_path, monkeypatch,
                                                        capsys, tool, option, fault):
    fuzz_env.count(f"write:{tool}{option}")
    monkeypatch.chdir(tmp_path)
    target = str(tmp_path / ("out.gguf" if option in ("--out", "--graph-out") else "out.json"))
    with open(target, "wb") as f:
        f.write(OLD)
    argv = [a.replace("{user}", fuzz_env.user)
            for a in _base(tool, option, str(tmp_path))] + [option, target]
    _inject(monkeypatch, fault, target)
    try:
        rc = main_of(tool)(argv)
    except SystemExit as exc:
        rc = exc.code
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert _error_lines(err) == [f"{tool}: cannot write {target}: {FAULTS[fault]}"], err
    with open(target, "rb") as f:
        assert f.read() == OLD
    assert _temporaries(str(tmp_path)) == []


# --- the pytest plugin -----------------------------------------------------------------------

PLUGIN = {"gradcheck": ["--gradcheck", "--gradcheck-op", "relu", "--gradcheck-dtype", "f64",
                        "--gradcheck-no-torch"],
          "optcheck": ["--optcheck", "--optcheck-opt", "sgd", "--optcheck-family",
                       "closed-form", "--optcheck-dtype", "f64", "--optcheck-steps", "2"]}
EIO_PLUGIN = '''
import errno, os
_fsync = os.fsync
def _eio(fd):
    if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".out.json."):
        raise OSError(errno.EIO, "Input/output error")
    return _fsync(fd)
os.fsync = _eio
'''
LONG = settings.get_current_profile_name() == "fuzz"


@pytest.mark.parametrize("kind", ["full", "eio", "directory", "read-only"])
@pytest.mark.parametrize("tool", sorted(PLUGIN))
def test_the_plugins_json_report(fuzz_env, tmp_path, tool, kind):
    """pytest's own exit status for a usage error (4), the line naming the file, the old
    report kept. /dev/full and EIO in every run; the refusals up front in the long one."""
    if kind in ("directory", "read-only") and not LONG:
        pytest.skip("the long run (HYPOTHESIS_PROFILE=fuzz) only")
    if kind == "full" and not HAS_DEV_FULL:
        pytest.skip("needs /dev/full")
    fuzz_env.count(f"write:pytest--{tool}-json")
    target = "/dev/full" if kind == "full" else str(tmp_path / "out.json")
    if kind == "directory":
        os.mkdir(target)
    elif kind in ("eio", "read-only"):
        with open(target, "wb") as f:
            f.write(OLD)
        os.chmod(target, 0o444 if kind == "read-only" else 0o644)
    (tmp_path / "eio_plugin.py").write_text(EIO_PLUGIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    extra = ["-p", "eio_plugin"] if kind == "eio" else []
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *extra,
                           *PLUGIN[tool], f"--{tool}-json={target}", "-q"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out[-2000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-2000:]
    assert f"cannot write {target}" in out, out[-2000:]
    if kind in ("eio", "read-only"):
        with open(target, "rb") as f:
            assert f.read() == OLD
    assert _temporaries(str(tmp_path)) == []
