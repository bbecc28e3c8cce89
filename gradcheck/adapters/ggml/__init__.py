"""gradcheck's adapter for ggml (https://github.com/ggml-org/ggml) through its C API.

    from gradcheck.adapters.ggml import GgmlAdapter
    adapter = GgmlAdapter()            # the libggml-python wheel's libraries
    adapter = GgmlAdapter("/path/to/ggml/build/bin")   # a user's own build

See adapter.py for how a case becomes a ggml graph, ops.py for the op table and coverage.py
for what ggml's backward lacks.
"""

from gradcheck.adapters.ggml.adapter import GgmlAdapter

__all__ = ["GgmlAdapter"]
