"""``python -m kernels.measure``: the measurement command line (kernels.measure.cli)."""

import sys

from kernels.measure.cli import main

sys.exit(main())
