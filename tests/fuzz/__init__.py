"""The fuzz suite: mutated GGUF models, graph files, checkpoints and IDX files, and hostile
command lines, each run in a memory- and time-bounded child process (tests.fuzz.child).

The short run is part of the default test run; `tox -e fuzz` (HYPOTHESIS_PROFILE=fuzz) runs
thousands of cases and prints the count per surface."""
