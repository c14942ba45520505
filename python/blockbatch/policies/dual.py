"""Policy ``dual``: Fast-dLLM's dual cache: K/V of everything outside the current block kept, the block
alone recomputed each step (the paper's baseline)."""

from __future__ import annotations

import functools

from . import _single_branch

NAME = "dual"
MULTI_BRANCH = False
OPTION_GROUP_HELP = None
TUNE_AXES = _single_branch.CACHED_TUNE_AXES
bench_options = functools.partial(_single_branch.cached_bench_options, NAME)
tune_rows = functools.partial(_single_branch.cached_tune_rows, NAME)
summary = _single_branch.summary
unit_sizes = _single_branch.unit_sizes
PLOT_COLOR = "tab:blue"
BLOCKS_ALIGNED_AT_ZERO = False
STEPS_WITH_CONFIDENCE = False
REFERENCE = _single_branch.REFERENCE
