"""`mnist`: train and evaluate the MNIST FC and CNN models (not implemented yet)."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="mnist",
        description="Train and evaluate the MNIST FC and CNN models as a regression check. "
                    "NOT IMPLEMENTED YET: this command only exits with status 2.")
    parser.parse_args(argv)
    print("mnist: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
