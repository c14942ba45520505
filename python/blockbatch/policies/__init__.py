"""Decoding policies on the Python side: one module per policy (``vanilla``, ``prefix``, ``dual``,
``blockbatch``, ``block``, ``window``, ``wavefront``) holding all that the front doors know about it, and this
registry, which they ask instead of testing a policy's name. Each module declares:

* ``NAME``: the policy's name (``DecodeOptions.policy``; the order of ``REGISTRY`` is the options
  table's, ``contract.POLICIES``), ``MULTI_BRANCH`` (several branches per request) and
  ``OPTION_GROUP_HELP`` (the title of its option group in ``generate --help``, None without one);
* ``BENCH_OPTIONS``: ``bench_options(gen_length)``, the options of the bare spec ``bench --policies NAME``;
* ``TUNE_AXES`` and ``tune_rows(grid, gen_length)``: the ``tune.Grid`` fields it reads and its
  configs with their coarse-to-fine rank (``tune.configs`` interleaves the policies);
* ``summary(stats)``: its part of ``generate``'s one human line per generation; ``PLOT_COLOR``:
  its colour in the tune and bench plots;
* ``unit_sizes(values)``: the block sizes ``gen_length`` must be a multiple of under the options
  ``values`` (a dict; None: the model family's default sizes), ``BLOCKS_ALIGNED_AT_ZERO`` (its
  blocks start at position 0, so block_length need not divide gen_length) and
  ``STEPS_WITH_CONFIDENCE`` (``steps`` bounds its confidence rule rather than naming a fixed
  schedule);
* ``REFERENCE``: family name -> its float32 reference entry ``entry(model, prompt, options,
  vocab_limit) -> (row, nfe)`` (the whole canvas row the native engine must equal, and the
  forwards), one row per family the policy decodes (``bench --compare-reference``, the toy evaluation).

The C++ decoders and their rules are csrc/decode/policies/. Adding a policy: docs/adding-a-policy.md."""

from __future__ import annotations

import types
from typing import Any, Mapping

import torch

from . import vanilla
from . import prefix
from . import dual
from . import blockbatch
from . import block
from . import window
from . import wavefront

# policy name (DecodeOptions.policy) -> its module, in the options table's order
REGISTRY: dict[str, types.ModuleType] = {
    m.NAME: m for m in (vanilla, prefix, dual, blockbatch, block, window, wavefront)
}

# The policy bench compares every other against (its "NFE/dual" and "x dual" columns): Fast-dLLM's
# dual cache, the paper's baseline.
BASELINE = dual.NAME


def get(name: str) -> types.ModuleType:
    """The module of policy ``name``; ValueError naming the known policies."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {name!r}; the policies are {', '.join(REGISTRY)}") from None


def summary_line(stats: Mapping[str, Any]) -> str:
    """One human line for a generation's stats (``stats["policy"]`` says whose)."""
    return get(stats["policy"]).summary(stats)


def reference(model, prompt: torch.Tensor, options, family: str, vocab_limit: int | None = None):
    """``options`` decoded by the float32 reference of its policy for a model of ``family``:
    ``(row, nfe)``, the whole canvas row (prompt + generation, EOS after an early exit) as an int64
    tensor and the forwards executed. ValueError when the policy has no reference on that family
    (the native engine refuses the pair too)."""
    module = get(options.policy)
    entry = module.REFERENCE.get(family)
    if entry is None:
        raise ValueError(
            f"policy {options.policy!r} has no reference decoder for {family} checkpoints; "
            f"it decodes {', '.join(module.REFERENCE) or 'no family'}"
        )
    return entry(model, prompt, options, vocab_limit)
