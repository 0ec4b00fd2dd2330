"""Matrix products: mm, bmm, addmm (:mod:`gemsops.ops.matmul.mm`)."""
