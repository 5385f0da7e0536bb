"""`python -m trunner`: the `trunner` command (trunner/cli.py)."""

import sys

from trunner.cli import main

sys.exit(main())
