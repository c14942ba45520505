"""Find and load the compiled extension (``_C*.so``) exactly once."""

from __future__ import annotations

import glob
import os

import torch

_loaded: str | None = None


def load_extension() -> str:
    """Load ``blockbatch/_C*.so`` (newest wins if a setup.py and a CMake build both left one)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")), key=os.path.getmtime, reverse=True)
    if not candidates:
        raise ImportError(
            f"blockbatch's C++ extension was not found in {here}. Build it with "
            "`pip install --no-build-isolation -e .` (see README.md).")
    torch.ops.load_library(candidates[0])
    _loaded = candidates[0]
    return _loaded
