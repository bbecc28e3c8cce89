"""`python -m mnist_target train|eval|regress ...`: the MNIST commands, also installed as the
console scripts mnist-train, mnist-eval and mnist-regress."""

import sys

from mnist_target.cli import main

sys.exit(main())
