"""Memory ops: copies (``clone``, ``cat``: :mod:`~gemsops.ops.memory.copy`), fills and
the factories built on them (:mod:`~gemsops.ops.memory.fill`), and the embedding lookup
with its dense backward (:mod:`~gemsops.ops.memory.embedding`)."""
