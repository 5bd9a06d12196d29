"""``python -m napkin_cat``: the ``napkin`` command line."""

import sys

from napkin_cat.cli import main

sys.exit(main())
