"""`optcheck`: check optimizer steps (not implemented yet)."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="optcheck",
        description="Compare optimizer updates with closed-form expectations and torch.optim "
                    "trajectories. NOT IMPLEMENTED YET: this command only exits with status 2.")
    parser.parse_args(argv)
    print("optcheck: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
