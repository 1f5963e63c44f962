"""``python -m onelaunch``: see :mod:`onelaunch.cli`."""
import sys

from .cli import main

sys.exit(main())
