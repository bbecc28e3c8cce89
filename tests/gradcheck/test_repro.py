"""parse_case (gradcheck.repro): a case's repr back to the case, anything else refused in
words, as a ValueError and nothing else."""

from __future__ import annotations

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
