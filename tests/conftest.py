import os

import hypothesis

hypothesis.settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True)
hypothesis.settings.register_profile("dev", max_examples=30, deadline=None)
# tox -e fuzz: the fuzz suite's long run (tests/fuzz sizes each surface by this profile's name)
hypothesis.settings.register_profile("fuzz", max_examples=30, deadline=None, print_blob=True)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                                 or ("ci" if os.environ.get("CI") else "dev"))

# numba's kernels: the one cache root of every tool and worker (NUMBA_CACHE_DIR if set, else
# <checkkit.cache.default_cache_dir()>/numba), which xdist's workers share safely
# (engine.backends.cpu.disk_cache); nothing to set here


def pytest_configure(config):
    """Under numba's CUDA simulator (tox -e cudasim) each test process keeps to one CPU,
    xdist's workers each to one of their own (engine.backends.cuda.launch.keep_to_one_cpu
    says why: the cudasim suite took 177 s so against 352-467 s on this 2-core machine)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(config.option, "numprocesses", None):
        return      # xdist's controller: its workers inherit its CPUs, and take one each
    from engine.backends.cuda.launch import keep_to_one_cpu
    keep_to_one_cpu(int(worker[2:]) if worker and worker[2:].isdigit() else 0)
