"""`python -m netcl ...` runs the `netcl` command (netcl.cli), where the console script is not on PATH."""

import sys

from netcl.cli import main

sys.exit(main())
