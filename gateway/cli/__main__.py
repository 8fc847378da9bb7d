"""``python -m effectgate.gateway.cli``: the ``effectgate`` command, as the console script runs it."""

import sys

from . import main

# Guarded, so a tool that imports every module (the wheel test walks the package) does not run the command.
if __name__ == "__main__":
    sys.exit(main())
