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
