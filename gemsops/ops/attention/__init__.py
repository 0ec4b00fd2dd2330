"""Attention: a Triton flash-attention forward and backward serving aten's SDPA overloads.

:mod:`.kernels` holds the Triton kernels (online-softmax forward saving the logsumexp;
a backward in three launches: ``delta = rowsum(dO * O)``, one kernel over key/value
blocks for dK and dV, one over query blocks for dQ, no atomics). :mod:`.sdpa` checks
the inputs, launches them, and declares the aten overloads and the public
``gemsops.scaled_dot_product_attention``; :mod:`.dropout` holds the Philox states a
dropout forward draws for its backward, and the rules that pair the two halves.
"""
