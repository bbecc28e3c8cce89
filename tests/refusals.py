"""A test made from a table of refusals: each argument, given to one function, raises one
error whose message matches (shared by the tests of functions that read what users give)."""

from __future__ import annotations

import pytest


def refusal_test(function, error: type[BaseException], cases):
    """A test parametrised over `cases`, (argument, pattern) pairs: `function(argument)`
    raises `error` with a message that `pattern` matches (re.search). Assign it to a
    module-level name starting with test_ for pytest to collect it."""
    @pytest.mark.parametrize("argument, match", cases)
    def test(argument, match):
        with pytest.raises(error, match=match):
            function(argument)
    return test
