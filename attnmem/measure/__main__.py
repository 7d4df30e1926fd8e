"""``python -m attnmem.measure``: the measurement command line (attnmem.measure.cli)."""

import sys

from attnmem.measure.cli import main

sys.exit(main())
