"""The main job: the decoder block trains one step the same with and without gemsops."""

from __future__ import annotations

from gemsops.demo import run_demo


def test_demo_block_matches_torch_and_is_served_by_gemsops() -> None:
    """Loss and gradients agree with torch's, and gemsops serves the block's compute ops."""
    report = run_demo(batch=2, seq=8, vocab=64, dim=32, heads=2, hidden=64)
    assert abs(report.loss_torch - report.loss_gemsops) < 1e-4
    assert report.max_grad_diff < 1e-4
    for op in ("mm.default", "embedding.default", "_softmax.default", "silu.default",
               "cross_entropy_loss.default", "cat.default",
               "clone.default", "fill_.Scalar"):  # fmt: skip
        assert report.served.get(op, 0) > 0, op
    assert report.handed_back == {}
    assert set(report.not_implemented) <= {"_unsafe_view.default", "ones_like.default"}
