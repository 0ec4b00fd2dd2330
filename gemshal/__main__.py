"""``python -m gemshal``: the same as the ``gemshal`` command."""

import sys

from gemshal.cli import main

sys.exit(main())
