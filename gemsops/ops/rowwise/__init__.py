"""Ops that work along the lines of a tensor: reductions (sum, mean, prod, amax, amin,
max / min, argmax / argmin, var_mean), cumsum, and softmax / log_softmax.

They share one view of the input (:mod:`~gemsops.ops.rowwise.layout`: an ``(M, N, K)``
problem reducing ``N``) and one tile indexing and launch (:mod:`~gemsops.ops.rowwise.tiles`).
The value reductions' kernels are in :mod:`~gemsops.ops.rowwise.value`, the public ops and
their aten declarations in :mod:`~gemsops.ops.rowwise.reduce`, the index-returning ones in
:mod:`~gemsops.ops.rowwise.index`, var_mean in :mod:`~gemsops.ops.rowwise.stats`, cumsum in
:mod:`~gemsops.ops.rowwise.scan` and softmax in :mod:`~gemsops.ops.rowwise.softmax`.
"""
