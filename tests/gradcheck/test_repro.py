"""parse_case (gradcheck.repro): a case's repr back to the case, anything else refused in
words, as a ValueError and nothing else."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.registry import all_ops
from gradcheck.repro import MAX_REPRO_CHARS, parse_case

REGISTRY_CASES = [case for op in all_ops().values() if op.samples for case in op.samples()]


@pytest.mark.parametrize("case", REGISTRY_CASES[::7], ids=str)
def test_every_registry_case_comes_back_from_its_repr(case):
    assert parse_case(repr(case)) == case


# pieces a case text is made of, so that the drawn texts get past the parser often
PIECES = st.sampled_from(["Sample(", "InputSpec(", "op='relu'", "op='pool_2d'", "inputs=",
                          "name='x'", "shape=", "(", ")", ",", "(3, 4)", "(-1,)", "-", "1",
                          "1e9", "'f16'", "dtype=", "params=", "(('kernel', (0, 0)),)",
                          "[", "]", "None", "True", "x", "**", "=", " "])


@given(st.one_of(st.text(max_size=60), st.lists(PIECES, max_size=30).map("".join)))
def test_any_text_is_a_case_or_a_value_error(text):
    try:
        parse_case(text)
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc) and "<ast." not in str(exc)


def test_the_text_is_capped_before_parsing():
    with pytest.raises(ValueError, match=f"at most {MAX_REPRO_CHARS} are read"):
        parse_case("(" * (MAX_REPRO_CHARS + 1))


# --- issue 31: a bad parameter, one given twice or left out, a case too big for the machine ----
# each refused by parse_case (a ValueError) and so by `gradcheck --repro` as a usage error:
# one line, exit 2, never an ERROR row

ROPE = ("Sample(op='rope', inputs=(InputSpec(name='x', shape=(3, 2, 16)), InputSpec(name='pos', "
        "shape=(3,), kind='int', low=1000, high=8000, dtype='i32', grad=False)), params=("
        "('attn_factor', 1.0), ('beta_fast', {beta_fast}), ('beta_slow', 1.0), ('ext_factor', "
        "{ext_factor}), ('freq_base', {freq_base}), ('freq_scale', 0.25), ('mode', 'normal'), "
        "('n_ctx_orig', 4096), ('n_dims', 16)), dtype='f32')")
RELU = "Sample(op='relu', inputs=(InputSpec(name='x', shape={shape}),), dtype='f32')"
SCALE_TWICE = ("Sample(op='scale', inputs=(InputSpec(name='x', shape=(3, 4)),), params=("
               "('scale', 2.0), ('scale', 3.0)), dtype='f32')")

REFUSED = [
    # log(freq_base) = 0 in YaRN's correction dims: ZeroDivisionError in the kernel's setup
    (ROPE.format(beta_fast=32.0, ext_factor=0.0, freq_base=1.0),
     "rope: freq_base must not be 1 with YaRN"),
    # log(n_ctx_orig / (2 pi beta_fast)) = log(0): a math domain error in the kernel's setup
    (ROPE.format(beta_fast=1e308, ext_factor=1.0, freq_base=10000.0),
     "rope: beta_fast must be at most 1e+06, got 1e+308"),
    (SCALE_TWICE, "scale: parameter 'scale' is given twice"),
    # the builder defaults n_past, the torch reference does not: an ERROR row (TypeError)
    ("Sample(op='diag_mask_zero', inputs=(InputSpec(name='x', shape=(4, 4)),), dtype='f32')",
     "diag_mask_zero: the case gives no 'n_past'; its cases give every one of n_past"),
]
IDS = ["freq_base=1", "huge beta_fast", "twice", "left out"]


@pytest.mark.parametrize("text, words", REFUSED, ids=IDS)
def test_a_bad_or_repeated_parameter_is_refused(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_case(text)


@pytest.mark.parametrize("text, words", REFUSED, ids=IDS)
def test_a_bad_or_repeated_parameter_is_a_usage_error(text, words, capsys):
    from gradcheck.cli import main
    assert main(["--repro", text, "--no-progress"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert not captured.out and len(lines) == 1, captured
    assert lines[0].startswith("gradcheck: --repro: ") and words in lines[0]


def test_the_same_cases_within_the_ranges_run():
    """The refused cases' neighbours (YaRN's freq_base 10000, beta_fast 32) are cases."""
    case = parse_case(ROPE.format(beta_fast=32.0, ext_factor=1.0, freq_base=10000.0))
    assert case.op == "rope" and dict(case.params)["freq_base"] == 10000.0


def test_a_case_larger_than_the_memory_available_is_refused_saying_the_estimate(monkeypatch):
    import gradcheck.repro as repro
    monkeypatch.setattr(repro, "available_memory", lambda: 3 << 30)
    with pytest.raises(ValueError) as info:
        parse_case(RELU.format(shape="(4096, 4096)"))
    assert re.fullmatch(r"relu: checking this case needs about 9\.\d GiB, this machine has "
                        r"3\.0 GiB available", str(info.value)), str(info.value)
    assert parse_case(RELU.format(shape="(1024, 1024)")).op == "relu"      # 1.5 GiB: fits


def test_every_registry_case_fits_the_machines_it_runs_on():
    """The estimate is conservative but not absurd: every registry case of the fast tier
    needs under 1.25 GiB (the first GiB is the run's own: torch, the kernels, threads), the
    scale tier's (up to 4.5 million elements) under 4 GiB."""
    import engine
    from engine.tensor import input_tensor
    from gradcheck.repro import memory_estimate
    worst = 0
    for op in all_ops().values():
        for case in [*(op.samples() if op.samples else ()), *(op.scale() if op.scale else ())]:
            leaves = [input_tensor(s.leaf_shape, s.dtype or case.dtype) for s in case.inputs]
            out = case.build(*leaves)
            need = memory_estimate(case, leaves, out if isinstance(out, tuple) else (out,))
            limit = (5 << 30) // 4 if case.tier == "fast" else 4 << 30
            assert need < limit, (str(case), need)
            worst = max(worst, need)
    assert worst > 1 << 30 and isinstance(engine.Graph, type)


def test_available_memory_reads_the_machine_and_the_process_limits():
    import resource

    from gradcheck.repro import available_memory
    have = available_memory()
    assert have is None or have > 0
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if have is not None and soft == resource.RLIM_INFINITY:
        assert have <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_under_an_address_space_limit_a_big_case_is_refused_at_once(tmp_path):
    """gradcheck --repro in a process bounded to 3 GiB of address space (as the fuzz
    suite's children are) refuses a relu of 2^24 elements, inside the 2^26-element limit,
    with the estimate, in seconds: before, it ran out of memory mid-check ("unexpected
    MemoryError", exit 1)."""
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))\n"
            "from gradcheck.cli import main\n"
            "sys.exit(main(['--repro', sys.argv[1], '--no-progress']))\n")
    done = subprocess.run([sys.executable, "-c", code, RELU.format(shape="(4096, 4096)")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and re.match(r"gradcheck: --repro: relu: checking this case needs "
                                        r"about 9\.\d GiB, this machine has \d+\.\d GiB "
                                        r"available$", lines[0]), done.stderr
