"""Policy ``vanilla``: a full forward over the whole canvas every step (LLaDA's schedules, Dream's
own sampler)."""

from __future__ import annotations

from . import _single_branch

NAME = "vanilla"
MULTI_BRANCH = False
OPTION_GROUP_HELP = None  # its options are the "decoding" group's and Dream's samplers
TUNE_AXES: tuple[str, ...] = ()  # one config: the reference decode


def bench_options(gen_length: int) -> dict:
    """One token per step: ``steps = gen_length``, no threshold."""
    return dict(policy=NAME, block_length=32, threshold=None, steps=gen_length)


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    return [(0.0, NAME)]


summary = _single_branch.summary
unit_sizes = _single_branch.unit_sizes
PLOT_COLOR = "tab:gray"
BLOCKS_ALIGNED_AT_ZERO = False
STEPS_WITH_CONFIDENCE = False
REFERENCE = _single_branch.REFERENCE
