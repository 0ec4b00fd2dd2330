"""A plugin whose import fails, as a plugin with a missing dependency would."""

raise ImportError("gemshal_broken_vendor needs the 'broken_runtime' package")
