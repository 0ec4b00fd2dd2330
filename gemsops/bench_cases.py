"""The cases of ``gemsops bench``: each a torch call on inputs it builds, and the work it does.

:func:`cases` is the suite (the reference table's rows plus LLM-shaped ones; a tiny one
that only proves the harness works). Each builder returns a :class:`BenchCase` whose
``make`` prepares the inputs on a device and returns the call to time, and whose bytes
or flops turn a time into GB/s or TFLOP/s. :mod:`gemsops.bench` times them;
:mod:`gemsops.bench_suite` builds the model-shape suite from the same pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import torch
from torch.nn import functional as F

__all__ = ["BenchCase", "Thunk", "cases"]

Thunk = Callable[[], Any]
"""The call a case times: no arguments, its result ignored."""


@attrs.frozen
class BenchCase:
    """One benchmark row: a torch call on prepared inputs, and the work it does."""

    op: str
    label: str
    dtype: torch.dtype
    make: Callable[[torch.device], Thunk]
    bytes: int = 0
    flops: int = 0


def _nbytes(dtype: torch.dtype, *numels: int) -> int:
    return sum(numels) * torch.empty((), dtype=dtype).element_size()


def _pointwise(
    op: str, fn: Callable[..., Any], n: int, dtype: torch.dtype, arity: int
) -> BenchCase:
    def make(dev: torch.device) -> Thunk:
        args = [torch.randn(n, device=dev, dtype=dtype) for _ in range(arity)]
        return lambda: fn(*args)

    return BenchCase(op, f"{op} {n:,}", dtype, make, bytes=_nbytes(dtype, *([n] * (arity + 1))))


def _rows(
    op: str,
    fn: Callable[[torch.Tensor], Any],
    m: int,
    n: int,
    dtype: torch.dtype,
    out_numel: int | None = None,
    dim: int = -1,
) -> BenchCase:
    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, n, device=dev, dtype=dtype)
        return lambda: fn(x)

    out = m * n if out_numel is None else out_numel
    label = f"{op} {m}x{n}" if dim == -1 else f"{op}(dim={dim}) {m}x{n}"
    return BenchCase(op, label, dtype, make, bytes=_nbytes(dtype, m * n, out))


def _norm(op: str, m: int, n: int, dtype: torch.dtype) -> BenchCase:
    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, n, device=dev, dtype=dtype)
        w = torch.randn(n, device=dev, dtype=dtype)
        if op == "layer_norm":
            b = torch.randn(n, device=dev, dtype=dtype)
            return lambda: F.layer_norm(x, (n,), w, b, 1e-5)
        return lambda: F.rms_norm(x, (n,), w, 1e-6)

    return BenchCase(op, f"{op} {m}x{n}", dtype, make, bytes=_nbytes(dtype, 2 * m * n, n))


def _cross_entropy(m: int, v: int, dtype: torch.dtype) -> BenchCase:
    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, v, device=dev, dtype=dtype)
        t = torch.randint(0, v, (m,), device=dev)
        return lambda: F.cross_entropy(x, t)

    return BenchCase(
        "cross_entropy", f"cross_entropy {m}x{v}", dtype, make, bytes=_nbytes(dtype, m * v)
    )


def _mm(op: str, b: int, m: int, n: int, k: int, dtype: torch.dtype, *,
        transposed: bool = False) -> BenchCase:
    """mm / addmm (a bias row) / bmm; ``transposed``: bmm's right operand is a transposed
    view, as in attention scores ``q @ k.transpose(-2, -1)``."""

    def make(dev: torch.device) -> Thunk:
        if op == "bmm":
            x = torch.randn(b, m, k, device=dev, dtype=dtype)
            if transposed:
                y = torch.randn(b, n, k, device=dev, dtype=dtype).transpose(1, 2)
            else:
                y = torch.randn(b, k, n, device=dev, dtype=dtype)
            return lambda: torch.bmm(x, y)
        x = torch.randn(m, k, device=dev, dtype=dtype)
        y = torch.randn(k, n, device=dev, dtype=dtype)
        if op == "addmm":
            bias = torch.randn(n, device=dev, dtype=dtype)
            return lambda: torch.addmm(bias, x, y)
        return lambda: torch.mm(x, y)

    shape = f"{b}x{m}x{n}x{k}" if op == "bmm" else f"{m}x{n}x{k}"
    label = f"{op} {shape}{' (b transposed)' if transposed else ''}"
    return BenchCase(op, label, dtype, make, flops=2 * b * m * n * k)


def _linear(m: int, n: int, k: int, dtype: torch.dtype, *, bias: bool) -> BenchCase:
    """``F.linear`` as a model calls it: a [n, k] weight read transposed, optional bias."""

    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, k, device=dev, dtype=dtype)
        w = torch.randn(n, k, device=dev, dtype=dtype)
        b = torch.randn(n, device=dev, dtype=dtype) if bias else None
        return lambda: F.linear(x, w, b)

    label = f"linear {m}x{n}x{k}{' +bias' if bias else ''}"
    return BenchCase("linear", label, dtype, make, flops=2 * m * n * k)


def _broadcast_add(m: int, n: int, dtype: torch.dtype) -> BenchCase:
    """A bias row added to a matrix: the second operand broadcast along dim 0."""

    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, n, device=dev, dtype=dtype)
        row = torch.randn(n, device=dev, dtype=dtype)
        return lambda: x + row

    return BenchCase("add", f"add {m}x{n} + row", dtype, make,
                     bytes=_nbytes(dtype, 2 * m * n, n))


def _backward(op: str, m: int, n: int, dtype: torch.dtype) -> BenchCase:
    """Forward + backward of a row op (softmax, rms_norm, layer_norm); the bytes are both
    passes': forward reads x and writes y, backward reads dy and x (y for softmax) and
    writes dx (norms: and the weight gradient)."""

    def make(dev: torch.device) -> Thunk:
        x = torch.randn(m, n, device=dev, dtype=dtype, requires_grad=True)
        g = torch.randn(m, n, device=dev, dtype=dtype)
        if op == "softmax":
            return lambda: torch.autograd.grad(torch.softmax(x, -1), (x,), g)
        w = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
        if op == "layer_norm":
            bw = torch.randn(n, device=dev, dtype=dtype, requires_grad=True)
            return lambda: torch.autograd.grad(
                F.layer_norm(x, (n,), w, bw, 1e-5), (x, w, bw), g)
        return lambda: torch.autograd.grad(F.rms_norm(x, (n,), w, 1e-6), (x, w), g)

    return BenchCase(op, f"{op} fwd+bwd {m}x{n}", dtype, make,
                     bytes=_nbytes(dtype, 5 * m * n))


def _embedding(tokens: int, vocab: int, dim: int, dtype: torch.dtype) -> BenchCase:
    def make(dev: torch.device) -> Thunk:
        w = torch.randn(vocab, dim, device=dev, dtype=dtype)
        idx = torch.randint(0, vocab, (tokens,), device=dev)
        return lambda: F.embedding(idx, w)

    return BenchCase(
        "embedding",
        f"embedding {tokens}x{dim} of {vocab}",
        dtype,
        make,
        bytes=_nbytes(dtype, 2 * tokens * dim),
    )


def _attention(b: int, hq: int, hkv: int, lq: int, lk: int, d: int, dtype: torch.dtype, *,
               causal: bool, backward: bool) -> BenchCase:
    """F.scaled_dot_product_attention (SDPA's flash / efficient overloads), forward or
    forward + backward; FLOPs as flash attention counts them (backward 2.5x the forward,
    halved when causal)."""

    def make(dev: torch.device) -> Thunk:
        q = torch.randn(b, hq, lq, d, device=dev, dtype=dtype, requires_grad=backward)
        k = torch.randn(b, hkv, lk, d, device=dev, dtype=dtype, requires_grad=backward)
        v = torch.randn(b, hkv, lk, d, device=dev, dtype=dtype, requires_grad=backward)
        gqa = hq != hkv
        if not backward:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=gqa)
        g = torch.randn(b, hq, lq, d, device=dev, dtype=dtype)
        return lambda: torch.autograd.grad(
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
            (q, k, v), g)

    fwd = 4 * b * hq * lq * lk * d // (2 if causal else 1)
    heads = f"{hq}" if hq == hkv else f"{hq}/{hkv}"
    label = (f"sdpa{' causal' if causal else ''} {'fwd+bwd' if backward else 'fwd'} "
             f"{b}x{heads}x{lq}x{lk}x{d}")
    return BenchCase("attention", label, dtype, make,
                     flops=fwd * 7 // 2 if backward else fwd)


def _llama_508m_shapes() -> list[tuple[int, ...]]:
    """The parameter shapes of the width-2048 Llama (8 layers, 16 heads over 8 KV heads of
    128, SwiGLU 5632, vocabulary 32000): 75 tensors, 508M elements."""
    h, kv, f, v = 2048, 1024, 5632, 32000
    layer = [(h, h), (kv, h), (kv, h), (h, h), (f, h), (f, h), (h, f), (h,), (h,)]
    return [(v, h), *(layer * 8), (h,), (v, h)]


def _optimizer(shapes: list[tuple[int, ...]], dtype: torch.dtype, *, fused: bool,
               label: str) -> BenchCase:
    """One ``torch.optim.AdamW`` step over parameters of ``shapes`` (foreach, torch's
    default on accelerators, or fused); bytes: parameters, gradients and both moments
    read, parameters and moments written."""

    def make(dev: torch.device) -> Thunk:
        params = [torch.randn(s, device=dev, dtype=dtype, requires_grad=True) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, foreach=not fused, fused=fused)
        return opt.step

    numel = sum(math.prod(s) for s in shapes)
    kind = "fused" if fused else "foreach"
    return BenchCase("adamw", f"adamw {kind} {label}", dtype, make,
                     bytes=_nbytes(dtype, 7 * numel))


def cases(*, tiny: bool) -> list[BenchCase]:
    """The benchmark suite: the reference table's rows plus LLM-shaped ones."""
    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    if tiny:
        return [
            _pointwise("add", torch.add, 1024, f32, 2),
            _rows("softmax", lambda x: torch.softmax(x, -1), 4, 64, f32),
            _rows("sum", lambda x: x.sum(-1), 4, 64, f32, out_numel=4),
            _mm("mm", 1, 16, 16, 16, f32),
            _mm("bmm", 2, 16, 16, 16, f32, transposed=True),
            _linear(4, 16, 16, f32, bias=True),
            _broadcast_add(4, 64, f32),
            _backward("rms_norm", 4, 64, f32),
            _backward("softmax", 4, 64, f32),
            _attention(1, 2, 2, 32, 32, 16, f32, causal=True, backward=False),
            _optimizer([(8, 16), (16,), (5,)], f32, fused=False, label="3 tensors"),
        ]
    return [
        _pointwise("add", torch.add, 2**28, bf16, 2),
        _pointwise("mul", torch.mul, 2**27, f32, 2),
        _pointwise("gelu", F.gelu, 2**28, bf16, 1),
        _pointwise("silu", F.silu, 2**28, bf16, 1),
        _pointwise("exp", torch.exp, 2**28, bf16, 1),
        _rows("sum", lambda x: x.sum(-1), 16384, 16384, bf16, out_numel=16384),
        _rows("amax", lambda x: x.amax(-1), 16384, 16384, bf16, out_numel=16384),
        _rows("argmax", lambda x: x.argmax(-1), 16384, 16384, bf16, out_numel=4 * 16384),
        _rows("sum", lambda x: x.sum(0), 16384, 16384, bf16, out_numel=16384, dim=0),
        _rows("var_mean", lambda x: torch.var_mean(x, -1), 8192, 8192, f32, out_numel=16384),
        _rows("cumsum", lambda x: x.cumsum(-1), 8192, 8192, f32),
        _rows("softmax", lambda x: torch.softmax(x, -1), 16384, 16384, bf16),
        _rows("softmax", lambda x: torch.softmax(x, -1), 262144, 256, bf16),
        _rows("log_softmax", lambda x: torch.log_softmax(x, -1), 4096, 32000, bf16),
        _norm("layer_norm", 65536, 4096, bf16),
        _norm("rms_norm", 65536, 4096, bf16),
        _norm("rms_norm", 8192, 8192, bf16),
        _cross_entropy(8192, 128256, bf16),
        _cross_entropy(4096, 32000, bf16),
        _embedding(8192, 128256, 4096, bf16),
        # Matmuls: square products in both half types, a linear layer (weight read
        # transposed, bias fused), batched products (attention scores: the right operand
        # transposed), and decode shapes (M = 1, 4, 16 rows against 4096 and 14336 wide).
        *[_mm("mm", 1, s, s, s, dt) for dt in (bf16, f16) for s in (4096, 8192)],
        _mm("addmm", 1, 4096, 4096, 4096, bf16),
        *[_linear(s, s, s, dt, bias=True) for dt in (bf16, f16) for s in (4096, 8192)],
        _mm("bmm", 64, 2048, 2048, 128, bf16),
        _mm("bmm", 64, 2048, 2048, 128, bf16, transposed=True),
        _mm("bmm", 64, 2048, 128, 2048, bf16),
        *[_mm("mm", 1, m, n, 4096, bf16) for n in (4096, 14336) for m in (1, 4, 16)],
        *[_linear(m, n, 4096, bf16, bias=False) for n in (4096, 14336) for m in (1, 16)],
        # Memory-bound rows that training leans on: a broadcast operand, the backward passes.
        _broadcast_add(16384, 16384, bf16),
        _pointwise("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), 2**28, bf16, 1),
        _backward("softmax", 16384, 16384, bf16),
        _backward("rms_norm", 65536, 4096, bf16),
        _backward("layer_norm", 65536, 4096, bf16),
        # Attention: a training step's shapes (causal), and decode (one query, a long
        # cache, grouped-query heads).
        _attention(4, 16, 16, 2048, 2048, 128, bf16, causal=True, backward=False),
        _attention(4, 16, 16, 2048, 2048, 128, bf16, causal=True, backward=True),
        _attention(4, 32, 8, 1, 4096, 128, bf16, causal=False, backward=False),
        # The optimizer step of the width-2048 Llama (issue 27): torch's foreach AdamW
        # (its default on accelerators) and the fused one.
        *[_optimizer(_llama_508m_shapes(), bf16, fused=fused, label="508M Llama")
          for fused in (False, True)],
    ]
