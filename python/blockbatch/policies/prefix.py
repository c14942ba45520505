"""Policy ``prefix``: Fast-dLLM's prefix cache: the prompt and finished blocks' K/V kept, the current
block and all after it recomputed each step."""

from __future__ import annotations

import functools

from . import _single_branch

NAME = "prefix"
MULTI_BRANCH = False
OPTION_GROUP_HELP = None
TUNE_AXES = _single_branch.CACHED_TUNE_AXES
bench_options = functools.partial(_single_branch.cached_bench_options, NAME)
tune_rows = functools.partial(_single_branch.cached_tune_rows, NAME)
summary = _single_branch.summary
unit_sizes = _single_branch.unit_sizes
PLOT_COLOR = "tab:green"
BLOCKS_ALIGNED_AT_ZERO = False
STEPS_WITH_CONFIDENCE = False
REFERENCE = _single_branch.REFERENCE
