"""Where the tools keep what they may rebuild (the MNIST pixels, jax's compiled updates):
$GRADVERIFY_CACHE if set, else $XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$GRADVERIFY_CACHE if set, else $XDG_CACHE_HOME/gradverify, else ~/.cache/gradverify."""
    if os.environ.get("GRADVERIFY_CACHE"):
        return Path(os.environ["GRADVERIFY_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "gradverify"
