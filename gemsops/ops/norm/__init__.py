"""Layer norm and RMS norm, forward and backward: the host side and aten declarations in
:mod:`~gemsops.ops.norm.norm`, the Triton kernels in :mod:`~gemsops.ops.norm.kernels`."""
