"""`gradcheck` whose workers of our engine carry the out-of-bounds write of
tests.gradcheck.planted_oob (imported in every worker, never in this process):

    python -m tests.gradcheck.planted_run --op relu --dtype f32 --isolate
"""

from __future__ import annotations

import sys

from checkkit import worker
from gradcheck.cli import main

PLANTED = "tests.gradcheck.planted_oob"

if __name__ == "__main__":
    worker.PRELOAD.append(PLANTED)
    sys.exit(main())
