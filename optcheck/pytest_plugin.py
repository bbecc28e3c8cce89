"""optcheck's pytest plugin: `pytest --optcheck`, the family runs of the request its options
make (optcheck.request.OptcheckRequest: `--optcheck-NAME` per field that chooses them) as
pytest items, spread by pytest-xdist over processes and hosts (checkkit.sweep has the
machinery and the details).

    pytest --optcheck -n auto                            what `optcheck --opt all` checks
    pytest --optcheck --optcheck-opt adam -n 2 --junitxml=optcheck.xml

One item per family, optimizer and dtype, `adam: torch(type=f32)`, running
optcheck.runner.run_family; its rows are that family's scenarios. The package registers it
(entry point `pytest11`); it is idle, and loads no engine, unless --optcheck is given.
"""

from checkkit.sweep import ToolPlugin
from optcheck.request import OptcheckRequest

PLUGIN = ToolPlugin(OptcheckRequest)
pytest_addoption = PLUGIN.pytest_addoption
pytest_configure = PLUGIN.pytest_configure
