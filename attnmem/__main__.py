import sys

from attnmem.cli import main

sys.exit(main())
