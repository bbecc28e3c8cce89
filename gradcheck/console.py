"""The `gradcheck` console script (pyproject.toml): gradcheck.cli.main inside checkkit.console's
launch, which the command line loads only inside it (module doc there)."""

from checkkit.console import script  # the standard library only

gradcheck = script("gradcheck", "gradcheck.cli")
