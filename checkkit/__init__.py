"""The checkers' toolkit: what gradcheck and optcheck both need, below both of them.

Adapter loading (`module:attr`), the isolated worker process and its crash rows, crash
reports, one-line usage errors and the argument parser, interruption with partial results,
the shared command-line options, the precision rule, and the single ggml library binding.
gradcheck and optcheck import this package; neither imports the other.
"""
