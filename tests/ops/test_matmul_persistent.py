"""The persistent tensor-descriptor matmul (gemsops.ops.matmul.persistent).

Its kernel runs on the CPU interpreter here and compiled on devices that have
``tensor_descriptors``; which products reach it is decided by ``eligible`` and the
device record, tested with the feature switched on for a CPU device.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemsops.ops.matmul import mm as MM
from gemsops.ops.matmul import persistent
from gemsops.testing.tolerance import assert_close

DEV = gemshal.current_device().torch_device
RUNS_KERNEL = DEV.type == "cpu" or gemshal.current_device().has("tensor_descriptors")
ALIGNED = st.integers(1, 9).map(lambda i: 8 * i)  # 16-byte multiples of fp16/bf16 rows


def _operand(rows: int, cols: int, dtype: torch.dtype, transposed: bool,
             batch: int | None) -> torch.Tensor:
    lead = () if batch is None else (batch,)
    if transposed:
        return torch.randn(*lead, cols, rows, dtype=dtype, device=DEV).transpose(-1, -2)
    return torch.randn(*lead, rows, cols, dtype=dtype, device=DEV)


@pytest.mark.skipif(not RUNS_KERNEL, reason="this device has no tensor descriptors")
@settings(max_examples=20, deadline=None)
@given(m=ALIGNED, n=ALIGNED, k=ALIGNED, dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       a_t=st.booleans(), b_t=st.booleans(), batch=st.sampled_from([None, 1, 3]),
       bias=st.sampled_from([None, "row", "full"]), alpha=st.sampled_from([1.0, -0.5]),
       beta=st.sampled_from([1.0, 2.0]))
def test_persistent_kernel_matches_torch(m: int, n: int, k: int, dtype: torch.dtype, a_t: bool,
                                         b_t: bool, batch: int | None, bias: str | None,
                                         alpha: float, beta: float) -> None:
    """Property: for every operand layout the descriptors accept (row-major or transposed
    views, batched or not, ragged edge tiles), ``alpha * a @ b + beta * bias`` written by
    the persistent kernel equals torch's float32 product within the output type's
    rounding."""
    if bias is not None and batch is not None:
        bias = None  # addmm, the only product with a bias, is not batched
    a = _operand(m, k, dtype, a_t, batch)
    b = _operand(k, n, dtype, b_t, batch)
    shape = (*a.shape[:-1], n)
    c = torch.empty(shape, dtype=dtype, device=DEV)
    s = None
    if bias == "row":
        s = torch.randn(n, dtype=dtype, device=DEV).expand(shape)
    elif bias == "full":
        s = torch.randn(shape, dtype=dtype, device=DEV)
    persistent.launch(a, b, c, s, alpha, beta)
    want = alpha * (a.float() @ b.float())
    if s is not None:
        want = want + beta * s.float()
    assert_close(c, want.to(dtype), reduce_size=k)


@pytest.fixture
def with_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The current device, as if its vendor declared tensor descriptors for it."""
    real = gemshal.device_of

    def device_of(t: Any) -> gemshal.Device:
        d = real(t)
        return attrs.evolve(d, features=d.features | {"tensor_descriptors"})

    monkeypatch.setattr(gemshal, "device_of", device_of)


def test_eligible_follows_the_descriptor_rules(with_descriptors: None) -> None:
    """Aligned fp16/bf16 matrices with one unit stride qualify; fp32, a row of 7 halves
    (14 bytes) or an offset base (while pointer operands are off), a matrix without a unit
    stride, a batch stride of 0 and a column-major result do not."""
    h = torch.float16
    a, b = torch.randn(32, 64, dtype=h), torch.randn(64, 48, dtype=h)
    c = torch.empty(32, 48, dtype=h)
    assert persistent.eligible(a, b, c)
    a_t, b_t = torch.randn(64, 32, dtype=h).t(), torch.randn(48, 64, dtype=h).t()
    assert persistent.eligible(a_t, b_t, c)
    assert not persistent.eligible(a.float(), b.float(), c.float())
    assert not persistent.POINTER_OPERANDS
    assert not persistent.eligible(torch.randn(32, 7, dtype=h), torch.randn(7, 48, dtype=h), c)
    assert not persistent.eligible(torch.randn(32, 65, dtype=h)[:, 1:], b, c)
    assert not persistent.eligible(torch.randn(64, 64, dtype=h)[::2, ::2], b, c)
    shared = torch.randn(64, 48, dtype=h).expand(3, 64, 48)
    assert not persistent.eligible(torch.randn(3, 32, 64, dtype=h), shared,
                                   torch.empty(3, 32, 48, dtype=h))
    assert not persistent.eligible(a, b, torch.empty(48, 32, dtype=h).t())


def test_pointer_operands_admit_unaligned_matrices(with_descriptors: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With pointer operands on, a product one of whose matrices has an unaligned stride
    or base (a language-model head's 30522 columns) qualifies while another takes a
    descriptor; one with no aligned matrix, or a matrix without a unit stride, does not."""
    monkeypatch.setattr(persistent, "POINTER_OPERANDS", True)
    h = torch.float16
    a, b = torch.randn(32, 64, dtype=h), torch.randn(64, 48, dtype=h)
    c = torch.empty(32, 48, dtype=h)
    seven = torch.randn(32, 7, dtype=h)  # rows of 14 bytes
    assert persistent.eligible(seven, torch.randn(7, 48, dtype=h), c)
    assert persistent.eligible(torch.randn(32, 65, dtype=h)[:, 1:], b, c)  # offset base
    assert persistent.eligible(a, torch.randn(64, 7, dtype=h), torch.empty(32, 7, dtype=h))
    assert not persistent.eligible(seven, torch.randn(7, 7, dtype=h),
                                   torch.empty(32, 7, dtype=h))
    assert not persistent.eligible(torch.randn(64, 64, dtype=h)[::2, ::2], b, c)
    # ViT's attention: batches of 197x197 scores start off 16-byte boundaries (pointers),
    # q and k's batches of 197x64 on them (descriptors)
    q, k = torch.randn(3, 197, 64, dtype=h), torch.randn(3, 197, 64, dtype=h)
    scores = torch.empty(3, 197, 197, dtype=h)
    assert persistent.eligible(q, k.transpose(1, 2), scores)
    assert persistent.eligible(scores, k, torch.empty(3, 197, 64, dtype=h))
    monkeypatch.setattr(persistent, "POINTER_OPERANDS", False)
    assert not persistent.eligible(q, k.transpose(1, 2), scores)


RAGGED = st.integers(1, 70)  # any width: most are not 16-byte multiples of halves


@pytest.mark.skipif(not RUNS_KERNEL, reason="this device has no tensor descriptors")
@settings(max_examples=20, deadline=None)
@given(m=RAGGED, n=RAGGED, k=RAGGED, dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       a_t=st.booleans(), b_t=st.booleans(), batch=st.sampled_from([None, 2]),
       bias=st.booleans())
def test_persistent_kernel_reads_unaligned_matrices_through_pointers(
        m: int, n: int, k: int, dtype: torch.dtype, a_t: bool, b_t: bool, batch: int | None,
        bias: bool) -> None:
    """Property: at any widths, where some matrices' strides are not 16-byte multiples
    (read or written through pointers) and the others' are (through descriptors), the
    persistent kernel's ``a @ b (+ bias)`` equals torch's float32 product within the
    output type's rounding."""
    lead = () if batch is None else (batch,)
    # Padded to 8 columns where the property wants a descriptor: one operand always
    # takes one, so the kernel (not the portable one) is the product's.
    a = _operand(m, k, dtype, a_t, batch)
    b_rows, b_cols = (k, n)
    b_store = torch.randn(*lead, *((b_cols, -(-b_rows // 8) * 8) if b_t
                                   else (b_rows, -(-b_cols // 8) * 8)), dtype=dtype, device=DEV)
    b = (b_store[..., :b_rows].transpose(-1, -2) if b_t else b_store[..., :b_cols])
    c = torch.empty(*lead, m, n, dtype=dtype, device=DEV)
    s = torch.randn(n, dtype=dtype, device=DEV).expand(m, n) if bias and batch is None else None
    persistent.launch(a, b, c, s, 1.0, 1.0)
    want = a.float() @ b.float()
    if s is not None:
        want = want + s.float()
    assert_close(c, want.to(dtype), reduce_size=k)


@pytest.mark.skipif(not RUNS_KERNEL, reason="this device has no tensor descriptors")
@pytest.mark.parametrize("tokens", [13, 24])
def test_batches_starting_off_16_byte_boundaries_go_through_pointers(tokens: int) -> None:
    """Attention's two products at a ViT-like 13 tokens (batch entries of 13x13 halves
    start off 16-byte boundaries; 24 tokens: every matrix aligned), as the persistent
    kernel's ``q @ k^T`` and ``p @ v``: equal to torch's float32 products."""
    dtype = torch.bfloat16
    q = torch.randn(3, tokens, 16, dtype=dtype, device=DEV)
    k = torch.randn(3, tokens, 16, dtype=dtype, device=DEV)
    scores = torch.empty(3, tokens, tokens, dtype=dtype, device=DEV)
    persistent.launch(q, k.transpose(1, 2), scores, None, 1.0, 0.0)
    assert_close(scores, (q.float() @ k.float().transpose(1, 2)).to(dtype), reduce_size=16)
    p = torch.softmax(scores.float(), -1).to(dtype)
    out = torch.empty(3, tokens, 16, dtype=dtype, device=DEV)
    persistent.launch(p, k, out, None, 1.0, 0.0)
    assert_close(out, (p.float() @ k.float()).to(dtype), reduce_size=tokens)


def test_eligible_needs_the_device_feature() -> None:
    """Without ``tensor_descriptors`` in the device record nothing qualifies."""
    h = torch.float16
    a, b = torch.randn(32, 64, dtype=h), torch.randn(64, 48, dtype=h)
    c = torch.empty(32, 48, dtype=h)
    has = gemshal.device_of(a).has("tensor_descriptors")
    assert persistent.eligible(a, b, c) is has


def test_products_route_to_the_persistent_kernel_where_eligible(
    with_descriptors: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mm / addmm / bmm in half types go to the persistent kernel when the device has the
    feature; fp32, and decode shapes (at most 16 rows), keep the portable kernel."""
    calls: list[tuple[int, ...]] = []

    def record(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *rest: Any) -> None:
        calls.append(tuple(c.shape))
        c.copy_(torch.matmul(a.float(), b.float()).to(c.dtype))

    monkeypatch.setattr(persistent, "launch", record)

    def randn(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=DEV)

    MM.mm(randn(32, 64), randn(64, 48))
    MM.addmm(randn(48), randn(32, 64), randn(48, 64).t())
    MM.bmm(randn(2, 32, 64), randn(2, 64, 48))
    assert calls == [(32, 48), (32, 48), (2, 32, 48)]
    MM.mm(randn(32, 64, dtype=torch.float32), randn(64, 48, dtype=torch.float32))
    MM.mm(randn(4, 4096), randn(4096, 64))  # decode-shaped: the narrow-tile kernel
    MM.mm(randn(16, 64), randn(64, 48))
    assert len(calls) == 3
