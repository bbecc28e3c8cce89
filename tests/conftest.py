import os

import hypothesis

hypothesis.settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True)
hypothesis.settings.register_profile("dev", max_examples=30, deadline=None)
# tox -e fuzz: the fuzz suite's long run (tests/fuzz sizes each surface by this profile's name)
hypothesis.settings.register_profile("fuzz", max_examples=30, deadline=None, print_blob=True)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                                 or ("ci" if os.environ.get("CI") else "dev"))

# numba's disk cache is not safe across processes that compile the same function at once:
# two xdist workers adding an overload each may both write its machine code to the same
# numbered file, and the index of one then points at the other's code ("can't unbox array
# from PyObject", seen once in a fresh clone's CI). Each worker gets a cache of its own,
# set before anything imports numba (it reads NUMBA_CACHE_DIR once, on import).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    _base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".numba_cache")
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(_base, f"xdist-{_WORKER}")
