"""The `optcheck` console script (pyproject.toml): optcheck.cli.main inside checkkit.console's
launch, which the command line loads only inside it (module doc there)."""

from checkkit.console import script  # the standard library only

optcheck = script("optcheck", "optcheck.cli")
