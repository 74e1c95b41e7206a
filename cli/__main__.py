"""`python -m dflash_edge.cli ARGS`: the same as the `dflash-edge` command."""

import sys

from . import main

sys.exit(main())
