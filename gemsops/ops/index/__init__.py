"""Indexing: gather, scatter, scatter_add, index_select, index_add and topk.

``gather`` and ``index_select`` read one element per output position through an index
along ``dim``; ``scatter``, ``scatter_add`` and ``index_add`` write (or atomically add)
one source element per index position into a copy of ``self`` (or ``self`` in place).
All five are one strided kernel (:mod:`~gemsops.ops.index.kernels`) walking the index's
positions with the tensors' own strides; ``index_select`` and ``index_add`` pass their
1-D index as a view broadcast over the other dims. ``topk`` selects the k best of each
row through order-preserving integer keys, in chunks when a row is long.

An index outside ``[0, size)`` is an error in torch. The kernels never read or write
out of bounds for one (such lanes are masked off) and assert under ``TRITON_DEBUG``; on
the CPU, where checking costs no device sync, the host raises ``IndexError`` as torch
does (the registry then hands the call to torch, which raises its own error).
"""
