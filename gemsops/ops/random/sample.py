"""multinomial: indices drawn from rows of non-negative weights, on counter-based Philox.

What HF generate's sampling calls (``torch.multinomial(probs, num_samples=1)``). The
samples follow the weights' distribution and are reproducible under
``torch.manual_seed`` (each call draws one Philox key from torch's generator,
:mod:`gemsops.ops.random.seed`, and so advances it), but they are **not torch's own
samples**: gemsops draws its own Philox numbers.

* **One sample per row, or samples with replacement**: inverse CDF. Sample ``s`` of row
  ``r`` draws ``u`` in [0, 1) from Philox counter ``r * num_samples + s``; one program
  per block of a row's samples sums the row (float32, float64 for float64 weights),
  then walks it again with a running prefix sum and takes the first index whose prefix
  exceeds ``u * total`` **among the positive weights**, so a zero weight is never drawn
  whatever the rounding. Where rounding leaves no prefix above ``u * total`` (``u`` next
  to 1), the last positive weight is drawn.
* **Without replacement, more than one sample**: the exponential race (Gumbel top-k):
  each weight ``w`` gets the key ``w / E`` with ``E`` an Exp(1) draw (Philox counter
  ``r * categories + c``), zero weights the key -1, and gemsops' own ``topk``
  (:mod:`gemsops.ops.index.topk`) takes the ``num_samples`` largest; their order is the
  order of the race, the law of drawing one by one without replacement.
  ``num_samples`` above ``topk``'s limit (128) is handed back.

Torch's checks: a weight tensor of other than 1 or 2 dims, ``num_samples <= 0``, more
samples than categories without replacement, and more than ``2**24`` categories are
refused on the host (``RuntimeError``, torch's words). Negative, infinite or nan weights
and rows summing to 0 need the values: on the CPU they are read and refused with torch's
error, and a row with fewer positive weights than ``num_samples`` without replacement is
handed back (torch then draws zero weights); on an accelerator nothing is read (no
device sync), and such a row still gives indices in range (0, or the last positive
weight's), never an error.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gemshal.kernel import kernel
from gemsops.declare import op
from gemsops.errors import Unsupported
from gemsops.ops.dtypes import FLOAT_DTYPES, check_supported
from gemsops.ops.grid import cdiv, next_power_of_2
from gemsops.ops.index.topk import MAX_K
from gemsops.ops.random.seed import philox_key

__all__ = ["multinomial"]

_BLOCK = 1024
"""Weights times samples one step of the inverse-CDF walk compares, over 4."""
_MAX_SAMPLE_BLOCK = 128
_MAX_CATEGORIES = 2**24
_MAX_COUNTERS = 2**32
_KEYS_BLOCK = 1024


# Not deferred: who serves the call decides the samples (see the dropout kernel).
@kernel("multinomial", defer=False)
@triton.jit
def _inverse_cdf_kernel(
    W,  # weights: row r, category c at r * sw_r + c * sw_c
    Out,  # int64 samples: row r, sample s at r * S + s
    Key,  # 0-dim int64 Philox key on the device
    C,  # categories
    S,  # samples per row
    sw_r, sw_c,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
    SBLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1) * SBLOCK + tl.arange(0, SBLOCK)
    live = s < S
    base = W + row * sw_r
    total = tl.sum(tl.zeros((BLOCK,), dtype=ACC), axis=0)
    for start in range(0, C, BLOCK):
        c = start + tl.arange(0, BLOCK)
        w = tl.load(base + c.to(tl.int64) * sw_c, mask=c < C, other=0).to(ACC)
        total += tl.sum(w, axis=0)
    r = tl.randint(tl.load(Key), (row * S + s).to(tl.uint32)).to(tl.uint32, bitcast=True)
    u = (r >> 8).to(tl.float32) * 5.9604644775390625e-08  # [0, 1) in 2**-24 steps
    target = u.to(ACC) * total
    chosen = tl.full((SBLOCK,), 2**31 - 1, tl.int32)
    last = tl.max(tl.full((BLOCK,), -1, tl.int32), axis=0)
    carry = tl.sum(tl.zeros((BLOCK,), dtype=ACC), axis=0)
    for start in range(0, C, BLOCK):
        c = start + tl.arange(0, BLOCK)
        w = tl.load(base + c.to(tl.int64) * sw_c, mask=c < C, other=0).to(ACC)
        cdf = carry + tl.cumsum(w, axis=0)
        positive = w > 0
        hit = (cdf[None, :] > target[:, None]) & positive[None, :]
        first = tl.min(tl.where(hit, c[None, :], 2**31 - 1), axis=1)
        chosen = tl.minimum(chosen, first)
        last = tl.maximum(last, tl.max(tl.where(positive, c, -1), axis=0))
        carry += tl.sum(w, axis=0)
    # No prefix above the target (u next to 1, or a row torch refuses): the last positive
    # weight, or 0 for a row with none. Never out of range.
    chosen = tl.where(chosen == 2**31 - 1, tl.maximum(last, 0), chosen)
    tl.store(Out + row * S + s, chosen.to(tl.int64), mask=live)


@kernel("multinomial_keys", defer=False)
@triton.jit
def _race_keys_kernel(
    W,  # weights: row r, category c at r * sw_r + c * sw_c
    Keys,  # float32 (float64 for float64 weights) keys, contiguous (rows, C)
    Key,  # 0-dim int64 Philox key on the device
    C,
    n,  # rows * C
    sw_r, sw_c,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    row = i // C
    c = i % C
    w = tl.load(W + row * sw_r + c * sw_c, mask=inside, other=0).to(ACC)
    r = tl.randint(tl.load(Key), i.to(tl.uint32)).to(tl.uint32, bitcast=True)
    u = ((r >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # (0, 1): 2**-23 steps
    e = tl.maximum(-tl.log(u), 2.9802322387695312e-08)  # Exp(1), kept above 0
    # Positive weights: keys above 0 (no underflow to a zero weight's); zero weights: -1.
    tiny = 1.1754943508222875e-38
    keys = tl.where(w > 0, tl.maximum(w / e.to(ACC), tiny), -1.0)
    tl.store(Keys + i, keys, mask=inside)


_CONSTS: dict[tuple[object, int, int], dict[str, object]] = {}


def _consts(acc: object, block: int, sblock: int) -> dict[str, object]:
    """The constant keywords of one launch (``sblock`` 0: the keys kernel's, which has
    none), one dict per set: the launch key remembers it by identity."""
    key = (acc, block, sblock)
    hit = _CONSTS.get(key)
    if hit is None:
        hit = {"ACC": acc, "BLOCK": block} if not sblock else {
            "ACC": acc, "BLOCK": block, "SBLOCK": sblock}
        _CONSTS[key] = hit
    return hit


def _check_rows(w: Tensor, num_samples: int, replacement: bool) -> None:
    """Torch's checks on the host: errors it raises whatever the values."""
    if w.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not w.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, "
                           f"got: {w.dtype}")
    if num_samples <= 0:
        raise RuntimeError(f"cannot sample n_sample <= 0 samples (n_sample={num_samples})")
    categories = w.shape[-1]
    if not replacement and num_samples > categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if categories > _MAX_CATEGORIES:
        raise RuntimeError(f"number of categories cannot exceed 2^24 (got {categories})")


def _check_values(w: Tensor, num_samples: int, replacement: bool) -> None:
    """Torch's checks that read the values: made on the CPU only (no device sync)."""
    if w.device.type != "cpu" or w.numel() == 0:
        return
    if not bool(((w >= 0) & (w < float("inf"))).all()):  # nan fails both
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if bool((w.sum(-1) == 0).any()):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement and num_samples > 1 and int((w > 0).sum(-1).min()) < num_samples:
        raise Unsupported(f"a row with fewer positive weights than num_samples={num_samples} "
                          "without replacement (torch draws zero weights)")


@op("multinomial.default", out="multinomial.out")
def multinomial(self: Tensor, num_samples: int, replacement: bool = False, *,
                generator: torch.Generator | None = None) -> Tensor:
    """Draw ``num_samples`` category indices from each row of weights ``self``.

    Args:
        self: Non-negative weights, 1-D (categories) or 2-D (rows, categories), float16,
            bfloat16, float32 or float64; rows need not sum to 1.
        num_samples: Samples per row.
        replacement: Draw with replacement (independent draws); without, the indices of
            a row are distinct.
        generator: The generator the Philox key is drawn from; the default generator of
            ``self``'s device when None.

    Returns:
        int64 indices, shape ``(num_samples,)`` or ``(rows, num_samples)``. They follow
        the weights' distribution but are not the samples torch would draw.

    Raises:
        RuntimeError: what torch refuses (see the module docstring).
        Unsupported: a dtype or size gemsops does not take (handed back to torch).
    """
    if self.layout != torch.strided:
        raise Unsupported("multinomial of a non-strided tensor")
    num_samples = int(num_samples)
    _check_rows(self, num_samples, bool(replacement))
    if self.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"multinomial of {self.dtype}")
    check_supported(self.dtype)
    _check_values(self, num_samples, bool(replacement))
    w = self if self.dim() == 2 else self.unsqueeze(0)
    rows, categories = w.shape
    if categories == 0 and rows:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    out = torch.empty((rows, num_samples), dtype=torch.int64, device=self.device)
    if rows == 0:
        return out if self.dim() == 2 else out[0]
    acc = tl.float64 if self.dtype == torch.float64 else tl.float32
    if replacement or num_samples == 1:
        if rows * num_samples > _MAX_COUNTERS:
            raise Unsupported(f"multinomial of {rows * num_samples} samples (32-bit Philox "
                              "counters)")
        key = philox_key(self.device, generator)
        sblock = min(next_power_of_2(num_samples), _MAX_SAMPLE_BLOCK)
        block = min(max(32, _BLOCK * 4 // sblock), max(16, next_power_of_2(categories)))
        grid = (rows, cdiv(num_samples, sblock))
        _inverse_cdf_kernel.launch(
            grid, (w, out, key, categories, num_samples, w.stride(0), w.stride(1)),
            _consts(acc, block, sblock))
    else:
        if num_samples > MAX_K:
            raise Unsupported(f"multinomial of {num_samples} samples without replacement "
                              f"(gemsops' topk takes k <= {MAX_K})")
        n = rows * categories
        if n > _MAX_COUNTERS:
            raise Unsupported(f"multinomial over {n} weights (32-bit Philox counters)")
        from gemsops.ops.index.topk import topk

        key = philox_key(self.device, generator)
        keys = torch.empty((rows, categories),
                           dtype=torch.float64 if acc == tl.float64 else torch.float32,
                           device=self.device)
        _race_keys_kernel.launch(
            (cdiv(n, _KEYS_BLOCK),), (w, keys, key, categories, n, w.stride(0), w.stride(1)),
            _consts(acc, _KEYS_BLOCK, 0))
        out = topk(keys, num_samples, -1, True, True)[1]
    return out if self.dim() == 2 else out[0]
