"""A small random checkpoint with the byte-level BPE tokenizer and the LLaDA2-style chat template
(``blockbatch make-random --tokenizer bpe``), made in a test's tmp folder."""

from __future__ import annotations

from pathlib import Path

from blockbatch import families
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.random_tokenizer import CHAT_TEMPLATE, build_bpe_tokenizer

VOCAB = 512


def make_bpe_checkpoint(folder: Path, family: str = "llada", vocab: int = VOCAB, template: str | None = CHAT_TEMPLATE):
    """Write it (d_model 64, one layer: made and loaded in well under a second) and return ``folder``."""
    overrides = dict(d_model=64, n_layers=1, n_heads=2, mlp_hidden_size=128, vocab_size=vocab)
    overrides["n_kv_heads"] = families.get(family).default_kv_heads(2)
    make_random_checkpoint(
        folder,
        family=family,
        tokenizer=build_bpe_tokenizer(vocab),
        chat_template=template,
        eos_token_id=vocab - 2,
        mask_token_id=vocab - 1,
        **overrides,
    )
    return folder
