"""Optimizer kernels: the ``_foreach_*`` ops and the fused Adam, AdamW and SGD steps.

``torch.optim`` with ``foreach=True`` (the default on accelerators) calls ``_foreach_*``
aten ops over lists of parameters and states; with ``fused=True`` it calls
``_fused_adamw_``, ``_fused_adam_`` and ``_fused_sgd_``. gemsops serves each such call
with one launch per dtype group of the lists, not one per tensor:

* :mod:`~gemsops.ops.optim.kernels`: the Triton kernels (an elementwise foreach kernel
  with the op as a constant, and one kernel for the whole Adam(W) or SGD update);
* :mod:`~gemsops.ops.optim.tables`: the host side: the checks, the grouping by dtypes,
  and the int64 device table of tile starts, element counts and data pointers that a
  program reads to find its tensor (kept between calls, keyed by its contents);
* :mod:`~gemsops.ops.optim.foreach` and :mod:`~gemsops.ops.optim.fused`: the declared
  overloads.

A kernel casts each int64 it loads from the table to a typed pointer
(``tl.load(table + i).to(W.dtype)``, ``W`` a one-element tensor of the list's dtype).
That works on the Triton interpreter too (on the CPU, a pointer is a host address), so
CI runs the same kernels as the device.
"""
