"""Memory ops: copies and casts (``clone``, ``cat``, ``_to_copy``, ``copy_``:
:mod:`~gemsops.ops.memory.copy`), fills and the factories built on them
(:mod:`~gemsops.ops.memory.fill`), ``arange`` (:mod:`~gemsops.ops.memory.arange`), a
tensor written into a window of a filled one (``constant_pad_nd``, ``slice_backward``,
``select_backward``: :mod:`~gemsops.ops.memory.window`), ``tril`` and ``triu``
(:mod:`~gemsops.ops.memory.triangle`), and the embedding lookup with its dense backward
(:mod:`~gemsops.ops.memory.embedding`)."""
