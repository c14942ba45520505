"""A small trained masked-diffusion LM shipped with the package, and the task it solves.

``toy/checkpoint`` is a LLaDA-layout Hugging Face folder (``load_checkpoint`` reads it) trained
by ``python -m blockbatch.toy.train`` on the chained-arithmetic task of ``toy.task``;
``python -m blockbatch.toy.evaluate`` measures exact-match accuracy and NFE per decoder.
"""

from __future__ import annotations

import os

CHECKPOINT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint")


def checkpoint_path() -> str:
    """Folder of the shipped toy checkpoint."""
    return CHECKPOINT_DIR


def load(dtype=None):
    """The shipped toy checkpoint as a ``blockbatch.Checkpoint`` (config, weights, tokenizer)."""
    from ..loading import load_checkpoint

    return load_checkpoint(CHECKPOINT_DIR, dtype)
