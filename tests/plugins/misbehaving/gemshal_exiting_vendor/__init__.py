"""A plugin that calls sys.exit() while it is imported, as a badly written one might."""

import sys

sys.exit("gemshal_exiting_vendor: no accelerator runtime here, exiting")
