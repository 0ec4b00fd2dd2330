"""Op families, one subpackage each (pointwise, rowwise, norm, loss, matmul, memory,
attention): private kernels and typed host functions declared with :func:`gemsops.op`,
plus the modules the families share (``dtypes``, ``outputs``, ``grid``)."""
