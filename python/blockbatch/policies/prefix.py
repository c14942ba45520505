"""Policy ``prefix``: Fast-dLLM's prefix cache: the prompt and finished blocks' K/V kept, the current
block and all after it recomputed each step."""

from __future__ import annotations

from . import _single_branch

NAME = "prefix"
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
