"""gradcheck's pytest plugin: `pytest --gradcheck`, the cases of the request its options make
(gradcheck.request.GradcheckRequest: `--gradcheck-NAME` per field) as pytest items, spread
by pytest-xdist over processes and hosts (checkkit.sweep has the machinery and the details).

    pytest --gradcheck -n auto                           what `gradcheck --all` checks
    pytest --gradcheck --gradcheck-op pool_2d --gradcheck-engine ggml -n auto
    pytest --gradcheck --gradcheck-random 200 --gradcheck-seed 0 -n auto
    pytest --gradcheck --gradcheck-tier scale --gradcheck-json=report.json -n auto

One item per case that `gradcheck` selects with the same options, named by its case string
(and `[BACKEND]` when more than one backend is checked) inside its op's brackets,
`gradcheck::relu[relu(type=f64,x=[10])]` (pytest reads an id's brackets as its parameters:
checkkit.sweep.item_name), running exactly what the command line runs for it; with
--gradcheck-random N, one item per op (and backend),
`OP(generated)`, runs that op's generated cases (hypothesis shrinks a failure within the
one call). An isolated engine (ggml) runs in one worker process per pytest process, kept
across items, restarted after a crash.

The package registers it (entry point `pytest11`); it is idle, and loads no engine, unless
--gradcheck is given.
"""

from checkkit.sweep import ToolPlugin
from gradcheck.request import GradcheckRequest

PLUGIN = ToolPlugin(GradcheckRequest)
pytest_addoption = PLUGIN.pytest_addoption
pytest_configure = PLUGIN.pytest_configure
