"""`python -m d1queue ...`: the command line (d1queue.interfaces.cli)."""

import sys

from .interfaces.cli import main

sys.exit(main())
