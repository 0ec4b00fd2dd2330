"""Matrix products: mm, bmm, addmm (:mod:`gemsops.ops.matmul.mm`), and the convolution
of non-overlapping patches a vision transformer embeds images with, as a product
(:mod:`gemsops.ops.matmul.conv`)."""
