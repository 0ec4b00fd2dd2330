"""``python -m gemsops``: the same as the ``gemsops`` command."""

import sys

from gemsops.cli import main

sys.exit(main())
