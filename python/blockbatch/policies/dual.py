"""Policy ``dual``: Fast-dLLM's dual cache: K/V of everything outside the current block kept, the block
alone recomputed each step (the paper's baseline)."""

from __future__ import annotations

from . import _single_branch

NAME = "dual"
MULTI_BRANCH = False
OPTION_GROUP_HELP = None
TUNE_AXES = ("block_lengths", "thresholds")


def bench_options(gen_length: int) -> dict:
    """The paper's settings (docs/ALGORITHMS.md 3): block 32, threshold 0.9."""
    return dict(policy=NAME, block_length=32, threshold=0.9)


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    return _single_branch.cached_tune_rows(NAME, grid, gen_length)


summary = _single_branch.summary
REFERENCE = _single_branch.REFERENCE
