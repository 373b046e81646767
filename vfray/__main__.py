"""``python -m vfray``: the same command as the ``vfray`` console script."""

import sys

from vfray.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
