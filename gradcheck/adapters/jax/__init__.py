"""jax as the engine under test: `gradcheck --engine jax`.

Each registry case runs its op's jax equivalent (jax.numpy, jax.lax, jax.nn) under jax.vjp
on jax's CPU device, in float64, float32, float16 and bfloat16 (gradcheck.adapters.jax.adapter
says how, and which cases are unsupported and why; .ops and .nn hold the equivalents). It
needs the `jax` extra: pip install 'gradverify[jax]'.
"""

from gradcheck.adapters.jax.adapter import INSTALL_HINT, JaxAdapter

__all__ = ["INSTALL_HINT", "JaxAdapter"]
