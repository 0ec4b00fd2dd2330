"""Op families, one module each: private kernels, typed host functions, an IMPLS table."""
