"""Small trained masked-diffusion LMs shipped with the package, and the task they solve.

Five checkpoints, trained on the chained-arithmetic task of ``toy.task`` with the same character
tokenizer and data (``python tools/train_toy.py``; the block-causal ones ``python tools/train_toy_llada2.py
[--family sdar]``):

* ``toy/checkpoint``: LLaDA layout (``--family llada``, the default);
* ``toy/checkpoint_dream``: Hugging Face Dream layout (``--family dream``): q/k/v biases, GQA,
  ``generation_config.json``, and Dream's shifted outputs (position ``p`` is read from the
  output at ``p - 1``);
* ``toy/checkpoint_llada2``: LLaDA2 layout (``model_type`` "llada2_moe": QK-norm, partial rotary, a
  dense layer then mixtures of 8 experts), block-causal, trained with the block-diffusion objective;
* ``toy/checkpoint_llada2_edit`` (``LLADA2_EDIT_CHECKPOINT_DIR``, not in ``CHECKPOINT_DIRS``): the LLaDA2 toy
  continued with LLaDA2.1's token-to-token objective (``train_toy_llada2.py --edit``), so its edits repair;
* ``toy/checkpoint_sdar``: SDAR layout (``model_type`` "sdar": a dense Qwen3 body, QK-norm), block-causal,
  trained with the same objective on blocks of 4, 8 and 16.

``load_checkpoint`` reads either (the family comes from ``config.json``);
``python -m blockbatch.toy.evaluate [--family dream]`` measures exact-match accuracy and NFE
per decoder.
"""

from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
CHECKPOINT_DIR = os.path.join(_HERE, "checkpoint")
DREAM_CHECKPOINT_DIR = os.path.join(_HERE, "checkpoint_dream")
LLADA2_CHECKPOINT_DIR = os.path.join(_HERE, "checkpoint_llada2")
SDAR_CHECKPOINT_DIR = os.path.join(_HERE, "checkpoint_sdar")
LLADA2_EDIT_CHECKPOINT_DIR = os.path.join(_HERE, "checkpoint_llada2_edit")
CHECKPOINT_DIRS = {
    "llada": CHECKPOINT_DIR,
    "dream": DREAM_CHECKPOINT_DIR,
    "llada2": LLADA2_CHECKPOINT_DIR,
    "sdar": SDAR_CHECKPOINT_DIR,
}
# Every checkpoint folder the package ships: CHECKPOINT_DIRS (one toy per family, what family-wide code iterates)
# plus the LLaDA2 editing toy (LLaDA2.1's T2T objective continued from the LLaDA2 toy, ``train_toy_llada2.py
# --edit``), kept out of CHECKPOINT_DIRS so that only the tests and benchmarks that name it decode it.
SHIPPED_CHECKPOINT_DIRS = {**CHECKPOINT_DIRS, "llada2 editing": LLADA2_EDIT_CHECKPOINT_DIR}


def checkpoint_path(family: str = "llada") -> str:
    """Folder of the shipped toy checkpoint of ``family`` (``"llada"``, ``"dream"``, ``"llada2"`` or ``"sdar"``)."""
    try:
        return CHECKPOINT_DIRS[family]
    except KeyError:
        raise ValueError(f"family must be one of {', '.join(CHECKPOINT_DIRS)}, got {family!r}") from None


def dream_checkpoint_path() -> str:
    """Folder of the shipped Dream-layout toy checkpoint (``checkpoint_path("dream")``)."""
    return DREAM_CHECKPOINT_DIR


def load(dtype=None, family: str = "llada"):
    """A shipped toy checkpoint as a ``blockbatch.Checkpoint`` (config, weights, tokenizer)."""
    from ..loading import load_checkpoint

    return load_checkpoint(checkpoint_path(family), dtype)
