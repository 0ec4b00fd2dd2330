"""Anvil's kernel overrides, declared with ``gemsops.op(..., vendor="anvil")``.

The ``gemsops.ops`` entry point names this module; gemsops imports it when it builds
its op table (after gemshal has chosen the vendor). Each declaration here applies on
Anvil only, where it wins over gemsops's portable kernel for the overloads it names;
on every other vendor it is ignored. An input the kernel does not take raises
:class:`gemsops.Unsupported` before touching any output, and the call goes to torch's
own kernel, counted in ``gemsops.record()``, as for gemsops's built-in kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import gemsops
from gemshal.kernel import kernel

__all__ = ["neg"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@kernel("anvil_neg", key=["n"])  # configs: [ops.anvil_neg] in tune/anvil.toml
@triton.jit
def _neg_kernel(x_ptr, out_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    if x.dtype != tl.float64:
        x = x.to(tl.float32)  # half types through float32: exact for a negation
    tl.store(out_ptr + offsets, (-x).to(out_ptr.dtype.element_ty), mask=mask)


@gemsops.op("neg.default", out="neg.out", inplace="neg_.default", vendor="anvil")
def neg(self: torch.Tensor) -> torch.Tensor:
    """``-self`` for floating tensors, by Anvil's own kernel; other dtypes go to torch."""
    if self.dtype not in _FLOATS:
        raise gemsops.Unsupported(f"anvil neg takes floating dtypes only, not {self.dtype}")
    if self.device.type != "cpu":
        raise gemsops.Unsupported(f"anvil neg: a tensor on {self.device}, not the CPU")
    x = self.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    if n:
        _neg_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, out, n)
    return out
