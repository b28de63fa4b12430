import sys

from akrelay.cli import main

sys.exit(main())
