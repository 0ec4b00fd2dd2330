"""The one tolerance table, shared by the tests, the conformance kit and the benchmarks."""

from __future__ import annotations

import torch

__all__ = ["TOLERANCE", "assert_close", "tolerance"]

# (atol, rtol) per result dtype, for results compared against a float64 reference.
# Half-precision rows reflect one rounding of the output (2^-8 for bf16, 2^-11 for fp16)
# plus accumulation-order differences in reductions.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
    torch.float32: (1.3e-5, 1.3e-6),
    torch.float64: (1e-7, 1e-7),
}


def tolerance(dtype: torch.dtype, *, reduce_size: int = 1) -> tuple[float, float]:
    """(atol, rtol) for ``dtype``; widened by sqrt of the reduction length for reductions."""
    atol, rtol = TOLERANCE.get(dtype, (0.0, 0.0))
    scale = max(1.0, float(reduce_size) ** 0.5)
    return atol * scale, rtol * scale


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    reduce_size: int = 1,
    check_dtype: bool = True,
    equal_nan: bool = True,
) -> None:
    """Assert ``actual`` matches a (float64, CPU) reference within the table's tolerance.

    ``expected`` is cast to ``actual``'s dtype first when it is a floating reference of
    higher precision, so the comparison measures the kernel, not the output rounding.
    """
    actual_cpu = actual.detach().cpu()
    if check_dtype:
        assert actual_cpu.shape == expected.shape, (actual_cpu.shape, expected.shape)
    atol, rtol = tolerance(actual_cpu.dtype, reduce_size=reduce_size)
    if actual_cpu.dtype.is_floating_point:
        torch.testing.assert_close(
            actual_cpu.double(),
            expected.detach().cpu().to(actual_cpu.dtype).double(),
            atol=atol,
            rtol=rtol,
            equal_nan=equal_nan,
            check_dtype=False,
        )
    else:
        torch.testing.assert_close(actual_cpu, expected.detach().cpu().to(actual_cpu.dtype))
