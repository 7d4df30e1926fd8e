"""``python -m kernels.bench``: the speed benchmark (kernels.bench.speed)."""

import sys

from kernels.bench.speed import main

sys.exit(main())
