"""gradcheck's adapter for tinygrad (`gradcheck --engine tinygrad`): the registry's ops as
tinygrad Tensor code, differentiated by tinygrad's autodiff on its CPU device."""

from gradcheck.adapters.tinygrad_adapter.adapter import TinygradAdapter

__all__ = ["TinygradAdapter"]
