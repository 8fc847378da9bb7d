"""``python -m effectgate.gateway.cli``: the ``effectgate`` command, as the console script runs it."""

import sys

from . import main

sys.exit(main())
