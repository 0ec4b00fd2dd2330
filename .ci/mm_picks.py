"""Which sm90 table row the portable matmul (``_mm_kernel``, entry ``mm``) launches at
the products of the model configs that take it (decode, unaligned heads, ViT's
attention bmm, split-K), with SPLIT_K compared as a size (today) and as a category
(``@kernel(..., categories=["SPLIT_K"])``): the products whose config differs. No GPU needed.

    python3 .ci/mm_picks.py

Products the persistent kernel takes (aligned, unsplit, more than 16 rows) are left
out: its entry is another table.
"""
from pathlib import Path

from gemshal.kernel.plan import bucket, nearest_row
from gemshal.tune_format import TuneSource, loads
from gemsops.ops.matmul.mm import _split_k

SMS = 132  # H100 SXM and H200
path = Path(__file__).resolve().parent.parent / "gemsops/tune/nvidia-sm90.toml"
rows = loads(path.read_text(), TuneSource(path, "vendor-arch", "sm90"), vendor="nvidia").ops["mm"].table


def aligned(*strides: int) -> bool:
    return all(s == 1 or (s * 2) % 16 == 0 for s in strides)  # bf16 rows, 16-byte TMA rule


cases = []
models = {"llama1b": (2048, 8192, 128256), "llama8b": (4096, 14336, 128256),
          "gpt2": (768, 3072, 50257), "bert": (768, 3072, 30522), "vit": (768, 3072, None)}
for name, (h, ff, vocab) in models.items():
    for t in (1, 2, 4, 8, 16, 4096, 6304, 8192, 16384):
        for k, n in [(h, h), (h, ff), (ff, h), (h, 3 * h)] + ([(h, vocab)] if vocab else []):
            # forward x @ W^T; input gradient dy @ W; weight gradient dy^T @ x
            for what, (m, nn, kk, sak, sbk, strides) in {
                    "fwd": (t, n, k, 1, 1, (k, k, n)), "dx": (t, k, n, 1, k, (n, k, k)),
                    "dw": (n, k, t, n, k, (n, k, k))}.items():
                if what == "fwd" or t > 16:
                    cases.append((f"{name} {what} {m}x{nn}x{kk}", 1, m, nn, kk, sak, sbk, strides))
# ViT-B/16 at 32 images: 384 heads of 197 tokens by 64
cases += [("vit scores 384x197x197x64", 384, 197, 197, 64, 1, 1, (197,)),
          ("vit p@v 384x197x64x197", 384, 197, 64, 197, 1, 64, (197,)),
          ("vit dv 384x197x64x197", 384, 197, 64, 197, 197, 64, (197,)),
          ("vit dp 384x197x197x64", 384, 197, 197, 64, 1, 197, (197,))]
changed = 0
for label, batch, m, n, k, sak, sbk, strides in cases:
    split = _split_k(batch, m, n, k, SMS)
    if split == 1 and not (batch == 1 and m <= 16) and batch == 1 and aligned(*strides):
        continue  # the persistent kernel's
    when = {"M": bucket(m), "N": bucket(n), "K": bucket(k), "stride_ak": bucket(sak),
            "stride_bk": bucket(sbk), "SPLIT_K": split, "HAS_BIAS": False}
    size, _ = nearest_row(rows, when, "bfloat16")
    category, _ = nearest_row(rows, when, "bfloat16", ("SPLIT_K",))
    if (size and size.config) != (category and category.config):
        changed += 1

        def show(row):
            if row is None:
                return "no row (the first config)"
            c = row.config
            tile = "x".join(str(dict(c.meta)[x]) for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
            return f"row of SPLIT_K={dict(row.when)['SPLIT_K']}: {tile} w{c.num_warps}s{c.num_stages}"

        print(f"{label} (split {split}): {show(size)} -> {show(category)}")
print(f"{changed} of {len(cases)} products change their config")
