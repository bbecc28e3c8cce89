"""The MNIST training target (not implemented yet: see the MNIST issue)."""
