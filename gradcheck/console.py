"""The `gradcheck` and `gradcheck-report` console scripts (pyproject.toml): gradcheck.cli.main
and gradcheck.report_cli.main inside checkkit.console's launch, which the command line loads
only inside it (module doc there)."""

from checkkit.console import script  # the standard library only

gradcheck = script("gradcheck", "gradcheck.cli")
gradcheck_report = script("gradcheck-report", "gradcheck.report_cli")
