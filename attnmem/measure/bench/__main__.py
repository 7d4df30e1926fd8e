"""``python -m attnmem.measure.bench``: the speed benchmark (attnmem.measure.bench.speed)."""

import sys

from attnmem.measure.bench.speed import main

sys.exit(main())
