"""Comparing per-row logits of two forwards (native against reference)."""

import torch

TOL = 1e-4  # float32: the native kernels and the reference round differently only in reductions


def assert_rows_close(expected, got, tol: float = TOL) -> None:
    """Same number of rows, same shapes, every row within `tol` (absolute and relative)."""
    assert len(expected) == len(got)
    for x, y in zip(expected, got):
        assert x.shape == y.shape
        torch.testing.assert_close(y, x, atol=tol, rtol=tol)
