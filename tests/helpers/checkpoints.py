"""Checkpoints the tests write."""

from __future__ import annotations

from blockbatch.loading import save_checkpoint
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.toy import tokenizer as toy_tok

# Renders [user "12"] with the generation prompt as "=12;+": 3 more tokens than the text.
TOY_CHAT_TEMPLATE = "{% for m in messages %}={{ m['content'] }};{% endfor %}{% if add_generation_prompt %}+{% endif %}"


def templated_toy_checkpoint(path) -> str:
    """A random LLaDA checkpoint on the toy tokenizer with TOY_CHAT_TEMPLATE; returns the template."""
    config = random_config(
        vocab_size=toy_tok.VOCAB_SIZE,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        pad_token_id=toy_tok.PAD_ID,
    )
    save_checkpoint(
        path, config, random_weights(config), tokenizer=toy_tok.build_tokenizer(), chat_template=TOY_CHAT_TEMPLATE
    )
    return TOY_CHAT_TEMPLATE
