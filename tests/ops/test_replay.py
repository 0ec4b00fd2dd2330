"""The replay memo (gemsops.ops.replay) over the matmuls: a call of a seen structure
replays outputs and launches with its own tensors; calls it must not take run as
written.

The second call of each pair is made with the implementation's deciding code disabled,
so a pass shows the memo answered, and the answer is compared with torch's for the
second operands.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gemshal
from gemshal.kernel import recording
from gemsops.ops import replay
from gemsops.ops.matmul import mm as mm_module
from gemsops.ops.pointwise import arith as pw
from gemsops.testing.strategies import target_device
from gemsops.testing.tolerance import assert_close


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    replay.clear()
    yield
    replay.clear()


def _no_deciding(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("decided afresh, not replayed")

    monkeypatch.setattr(mm_module, "launch_product", refuse)


def _matrix(rows: int, cols: int, dtype: torch.dtype, transposed: bool,
            seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if transposed:
        return torch.randn(cols, rows, generator=gen).to(dtype).to(target_device()).t()
    return torch.randn(rows, cols, generator=gen).to(dtype).to(target_device())


@settings(max_examples=12, deadline=None)
@given(m=st.sampled_from([1, 5, 16, 33]), k=st.sampled_from([1, 8, 17]),
       n=st.sampled_from([2, 16, 31]), dtype=st.sampled_from([torch.float32, torch.float16]),
       ta=st.booleans(), tb=st.booleans())
def test_mm_replay_multiplies_the_new_operands(m: int, k: int, n: int, dtype: torch.dtype,
                                               ta: bool, tb: bool) -> None:
    """Property: mm called again with operands of the first call's structure (transposed
    or not) gives the product of the new operands, in the first call's layout, without
    running mm's host code again."""
    replay.clear()
    a, b = _matrix(m, k, dtype, ta, 1), _matrix(k, n, dtype, tb, 2)
    first = mm_module.mm(a, b)
    assert_close(first, a.double().cpu() @ b.double().cpu(), reduce_size=k)
    assert replay.kept() == 1
    a2, b2 = _matrix(m, k, dtype, ta, 3), _matrix(k, n, dtype, tb, 4)
    with pytest.MonkeyPatch.context() as mp:
        _no_deciding(mp)
        second = mm_module.mm(a2, b2)
    assert second.stride() == first.stride() and second.dtype == dtype
    assert_close(second, a2.double().cpu() @ b2.double().cpu(), reduce_size=k)


def test_addmm_replays_a_broadcast_bias_from_the_new_input() -> None:
    """addmm's bias is a broadcast view of its input: the replay views the new input."""
    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        bias = torch.randn(7, generator=gen).to(dev)
        a = torch.randn(4, 5, generator=gen).to(dev)
        b = torch.randn(5, 7, generator=gen).to(dev)
        got = mm_module.addmm(bias, a, b, beta=0.5, alpha=2.0)
        want = 0.5 * bias.double().cpu() + 2.0 * (a.double().cpu() @ b.double().cpu())
        assert_close(got, want, reduce_size=5)
    assert replay.kept() == 1


def test_addmm_with_alpha_zero_is_never_kept() -> None:
    """alpha 0 writes the output with a torch call (no launch): it runs as written, and
    a nan in the matrices does not reach the result, on every call."""
    dev = target_device()
    a = torch.full((3, 4), float("nan"), device=dev)
    b = torch.ones(4, 2, device=dev)
    for v in (1.0, 2.0):
        bias = torch.full((3, 2), v, device=dev)
        got = mm_module.addmm(bias, a, b, beta=3.0, alpha=0.0)
        assert torch.equal(got.cpu(), torch.full((3, 2), 3.0 * v))
    assert replay.kept() == 0


def test_out_calls_run_as_written() -> None:
    """An out= call is never kept (its out is resized and checked each time)."""
    dev = target_device()
    a, b = torch.randn(3, 4, device=dev), torch.randn(4, 5, device=dev)
    for _ in range(2):
        out = torch.empty(0, device=dev)
        mm_module.mm(a, b, out=out)
        assert out.shape == (3, 5)
        assert_close(out, a.double().cpu() @ b.double().cpu(), reduce_size=4)
    assert replay.kept() == 0


def test_a_workspace_is_not_kept() -> None:
    """An op whose launches write a tensor that is neither an input nor an output (a
    workspace) is not kept: each call runs as written and is right."""

    @replay.replayable()
    def twice_plus_one(x: torch.Tensor) -> torch.Tensor:
        return pw.mul(pw.add(x, 1), 2)

    for v in (1.0, 5.0):
        x = torch.full((8,), v, device=target_device())
        assert torch.equal(twice_plus_one(x).cpu(), torch.full((8,), (v + 1) * 2))
    assert replay.kept() == 0


def test_one_launch_over_input_and_output_is_kept_and_replayed() -> None:
    """An op that is one pointwise launch into a new output is kept; its replay reads
    the new input."""

    @replay.replayable()
    def plus_one(x: torch.Tensor) -> torch.Tensor:
        return pw.add(x, 1)

    for v in (1.0, 5.0, -2.0):
        x = torch.full((8,), v, device=target_device())
        assert torch.equal(plus_one(x).cpu(), torch.full((8,), v + 1))
    assert replay.kept() == 1


def test_recording_sees_this_threads_launches_and_nests() -> None:
    """recording() collects the launches of its own thread; an inner block's launches
    reach the outer block too (in order), so the outer one sees every launch made
    inside it."""
    x = torch.randn(16, device=target_device())
    with recording() as outer:
        pw.add(x, 1)
        with recording() as inner:
            pw.mul(x, 3)
        pw.add(x, 2)
    assert len(inner.launches) == 1
    assert len(outer.launches) == 3
    assert outer.launches[1] is inner.launches[0]
    assert not outer.scratch


def test_the_scratch_allocator_request_is_noted() -> None:
    """A launch that asks for the scratch allocator marks the recording, so a replay on
    another thread asks for it too."""
    with recording() as rec:
        gemshal.ensure_scratch_allocator()
    assert rec.scratch


def test_a_prepared_launch_stands_down_while_recording() -> None:
    """A launch the pointwise memo has prepared (launches stubbed here, so the direct
    path exists on the CPU) goes the usual way inside recording(), so it is recorded."""
    from gemshal.kernel import stub_launches
    from gemsops.ops.pointwise import iterator

    iterator.clear_memo()
    x = torch.randn(64, device=target_device())
    with stub_launches():
        for _ in range(4):
            pw.add(x, 1)
        recipe = next(iter(iterator._MEMO.values()))
        assert recipe.prepared is not None
        with recording() as rec:
            pw.add(x, 1)
        assert len(rec.launches) == 1
    iterator.clear_memo()


def test_cat_replays_a_list_of_new_tensors() -> None:
    """cat of a list of tensors of one structure: the replay copies the new tensors into
    the right windows of the new output (views of the output) without cat's checks."""
    from gemsops.ops.memory import copy as copy_module

    dev = target_device()
    shapes = [(2, 3), (2, 5), (2, 1)]
    first = [torch.randn(s, generator=torch.Generator().manual_seed(i)).to(dev)
             for i, s in enumerate(shapes)]
    assert torch.equal(copy_module.cat(first, 1), torch.cat(first, 1))
    assert replay.kept() == 1
    second = [torch.randn(s, generator=torch.Generator().manual_seed(9 + i)).to(dev)
              for i, s in enumerate(shapes)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(copy_module, "_output_format", lambda *_: pytest.fail("decided afresh"))
        got = copy_module.cat(second, 1)
    assert torch.equal(got, torch.cat(second, 1))


def test_slice_backward_replays_zeros_and_the_new_gradient() -> None:
    """slice_backward zeroes around the window and copies the gradient into it: the
    replay does both on a fresh output (no stale values from the first call)."""
    from gemsops.ops.memory import window

    dev = target_device()
    for v in (1.0, 7.0, -3.0):
        grad = torch.full((4, 2), v, device=dev)
        got = window.slice_backward(grad, [4, 6], 1, 2, 4, 1)
        want = torch.zeros(4, 6)
        want[:, 2:4] = v
        assert torch.equal(got.cpu(), want)
    assert replay.kept() == 1


def test_sum_replays_over_the_new_input() -> None:
    """sum over a dim, kept from one call, sums the new input's values."""
    from gemsops.ops.rowwise import reduce as reduce_module

    dev = target_device()
    for seed in range(3):
        x = torch.randn(6, 9, generator=torch.Generator().manual_seed(seed)).to(dev)
        got = reduce_module.sum(x, [1])
        assert_close(got, x.double().cpu().sum(1), reduce_size=9)
    assert replay.kept() == 1


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 8), cols=st.integers(1, 600), seed=st.integers(0, 2**31 - 1))
def test_bool_reductions_replay_over_the_new_input(rows: int, cols: int, seed: int) -> None:
    """sum, all, any and amax of a bool tensor (read through its uint8 kernel view, a
    view of another dtype) give torch's answer on every call of one structure: the
    replay rebuilds the view over the new input (it once replayed the view as a fresh
    workspace and summed uninitialised memory; HF's mask check ``mask.sum() ==
    mask.numel()`` then failed and every step built a causal mask)."""
    from gemsops.ops.rowwise import reduce as reduce_module

    dev = target_device()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        x = torch.rand(rows, cols, generator=gen) < 0.5
        xd = x.to(dev)
        assert int(reduce_module.sum(xd, None).cpu()) == int(x.sum())
        assert torch.equal(reduce_module.sum(xd, [1]).cpu(), x.sum(1))
        assert torch.equal(reduce_module.amax(xd, [1]).cpu(), x.amax(1))
    assert replay.kept() >= 1


def test_a_split_sum_and_mean_replay_with_a_fresh_partial_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sum (and a mean) split across programs (a partial buffer, then a combining
    launch: bias gradients) is kept and replays the new input's values; a reduction over
    dims apart from each other (two reductions inside) runs as written."""
    from gemsops.ops.rowwise import layout
    from gemsops.ops.rowwise import reduce as reduce_module

    monkeypatch.setattr(layout, "SPLIT_MIN_TOTAL", 1024)
    monkeypatch.setattr(layout, "SPLIT_MIN_CHUNK", 64)
    dev = target_device()
    for seed in range(3):
        x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(seed)).to(dev)
        with recording() as rec:
            got = reduce_module.sum(x, [1])
            avg = reduce_module.mean(x, [1])
        if seed == 0:
            assert len(rec.launches) == 4, rec.launches  # split: two launches each
        assert_close(got, x.double().cpu().sum(1), reduce_size=4096)
        assert_close(avg, x.double().cpu().mean(1), reduce_size=4096)
    assert replay.kept() == 2
    y = torch.randn(3, 4, 5).to(dev)
    for _ in range(2):
        assert_close(reduce_module.sum(y, [0, 2]), y.double().cpu().sum((0, 2)), reduce_size=15)
    assert replay.kept() == 2


def test_softmax_forward_and_backward_replay_the_new_values() -> None:
    """aten's _softmax and its backward, kept from one call, compute from the new
    tensors on the next calls."""
    from gemsops.ops.rowwise import softmax as sm

    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(5, 33, generator=gen).to(dev)
        g = torch.randn(5, 33, generator=gen).to(dev)
        y = sm._softmax(x, -1, False)
        assert_close(y, torch.softmax(x.double().cpu(), -1))
        dx = sm.softmax_backward(g, y, -1, x.dtype)
        want = torch.ops.aten._softmax_backward_data(g.double().cpu(), y.double().cpu(), -1,
                                                     torch.float64)
        assert_close(dx, want, reduce_size=33)
    assert replay.kept() == 2


def test_rms_norm_replays_and_layer_norm_is_not_kept_on_the_cpu() -> None:
    """_fused_rms_norm is kept and replays (output and statistic from the new input);
    layer norm reads its input for huge values on the CPU, so there it is never kept."""
    from gemsops.ops.norm import norm

    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 16, generator=gen).to(dev)
        w = torch.randn(16, generator=gen).to(dev)
        y, rstd = norm.fused_rms_norm(x, [16], w, 1e-6)
        want_y, want_rstd = torch.ops.aten._fused_rms_norm(x.double().cpu(), [16],
                                                           w.double().cpu(), 1e-6)
        assert_close(y, want_y, reduce_size=16)
        assert_close(rstd.view(-1), want_rstd.view(-1), reduce_size=16)
    assert replay.kept() == 1
    x = torch.randn(4, 16, device=dev)
    norm.native_layer_norm(x, [16], None, None, 1e-5)
    assert replay.kept() == (1 if dev.type == "cpu" else 2)


def test_to_copy_and_clone_replay_the_new_values() -> None:
    """_to_copy (a dtype conversion of a transposed tensor) and clone, kept from one
    call, copy the new tensor's values with the first call's layout; a call naming a
    device is never kept."""
    from gemsops.ops.memory import copy as copy_module

    dev = target_device()
    for seed in range(3):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed)).to(dev).t()
        half = copy_module.to_copy(x, dtype=torch.float16)
        want = x.to(torch.float16)
        assert torch.equal(half, want) and half.stride() == want.stride()
        c = copy_module.clone(x)
        assert torch.equal(c, x) and c.stride() == x.clone().stride()
    assert replay.kept() == 2
    copy_module.to_copy(x, dtype=torch.float16, device=x.device)
    assert replay.kept() == 2


def test_attention_forward_and_backward_replay_with_a_workspace() -> None:
    """The attention forward (output and logsumexp, a view of its own statistics) and
    its backward (a row-statistics workspace written before it is read) replay with the
    new tensors; a bool mask (read by the kernels as it is stored) is kept too, and a
    replay reads the new call's mask."""
    from gemsops.ops.attention import sdpa

    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        q, k, v, g = (torch.randn(1, 2, 8, 16, generator=gen).to(dev) for _ in range(4))
        out, lse = sdpa.flash_attention_for_cpu(q, k, v, 0.0, True)
        ref = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
        want = torch.nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
        assert_close(out, want.detach(), reduce_size=8)
        dq, dk, dv = sdpa.flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, True)
        want.backward(g.double().cpu())
        for got, r in zip((dq, dk, dv), ref, strict=True):
            assert r.grad is not None
            assert_close(got, r.grad, reduce_size=16)
    assert replay.kept() == 2
    for seed in range(3):
        # A different mask each call (same layout): the replay must read each one.
        gen = torch.Generator().manual_seed(10 + seed)
        mask = torch.rand(8, 8, generator=gen) < 0.6
        mask[:, 0] = True  # every query sees a key
        out, _ = sdpa.flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask.to(dev))
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double().cpu(), k.double().cpu(), v.double().cpu(), attn_mask=mask)
        assert_close(out, want, reduce_size=8)
    assert replay.kept() == 3


def test_a_result_with_numbers_and_none_replays_them() -> None:
    """flash attention's forward returns tensors beside None and integers (its
    varlen fields): the replay gives the same constants and fresh tensors."""
    from gemsops.ops.attention import sdpa

    dev = target_device()
    firsts = []
    for seed in range(2):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, 8, 16, generator=gen).to(dev) for _ in range(3))
        got = sdpa.flash_attention(q, k, v, 0.0, True)
        assert got[2] is None and got[3] is None and got[4] == 8 and got[5] == 8
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double().cpu(), k.double().cpu(), v.double().cpu(), is_causal=True)
        assert_close(got[0], want, reduce_size=8)
        firsts.append(got[0])
    assert firsts[0] is not firsts[1]
    assert replay.kept() == 1


def test_dropout_backward_replays_and_a_mask_in_another_layout_runs_as_written() -> None:
    """native_dropout_backward, kept from one call, scales each new gradient by each new
    mask; a transposed mask (copied by a torch call first) is never kept."""
    from gemsops.ops.random import dropout as dropout_module

    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        g = torch.randn(6, 10, generator=gen).to(dev)
        mask = (torch.rand(6, 10, generator=gen) > 0.3).to(dev)
        got = dropout_module.native_dropout_backward(g, mask, 1.25)
        assert torch.equal(got, g * mask * 1.25)
    assert replay.kept() == 1
    mask_t = (torch.rand(10, 6) > 0.3).to(dev).t()
    got = dropout_module.native_dropout_backward(g, mask_t, 2.0)
    assert torch.equal(got, g * mask_t * 2.0)
    assert replay.kept() == 1


def test_efficient_attention_with_a_padding_bias_replays_its_forward() -> None:
    """The efficient forward with a float bias (BERT's padding mask) replays with the new
    tensors; a logsumexp with padding columns (filled by a torch call) is never kept,
    and a bool mask (read by the kernels as it is stored) is."""
    from gemsops.ops.attention import sdpa

    dev = target_device()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, 32, 16, generator=gen).to(dev) for _ in range(3))
        bias = torch.zeros(1, 1, 1, 32, device=dev)
        bias[..., 24 + seed:] = float("-inf")
        out, lse, _, _ = sdpa.efficient_attention(q, k, v, bias, True, 0.0, False)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double().cpu(), k.double().cpu(), v.double().cpu(),
            attn_mask=bias.double().cpu())
        assert_close(out, want, reduce_size=32)
        ref_lse = torch.logsumexp(
            (q.double().cpu() @ k.double().cpu().transpose(-1, -2)) / 4 + bias.double().cpu(),
            dim=-1)
        assert_close(lse[..., :32], ref_lse.float(), reduce_size=32)
    assert replay.kept() == 1
    q33 = torch.randn(1, 2, 33, 16).to(dev)
    sdpa.efficient_attention(q33, q33, q33, None, True, 0.0, False)
    assert replay.kept() == 1
    for cut in (20, 28):
        mask = torch.ones(32, 32, dtype=torch.bool)
        mask[:, cut:] = False
        out, _, _, _ = sdpa.efficient_attention(q, k, v, mask.to(dev), True, 0.0, False)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.double().cpu(), k.double().cpu(), v.double().cpu(), attn_mask=mask)
        assert_close(out, want, reduce_size=32)
    assert replay.kept() == 2
