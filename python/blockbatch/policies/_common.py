"""What several policy modules share (not a policy: ``policies.REGISTRY`` lists the policies)."""

from __future__ import annotations

import torch


def fmt(x: float) -> str:
    """A number in a policy spec (``threshold=0.9``)."""
    return f"{x:g}"


def tokens_per_forward(stats: dict) -> float:
    committed = sum(stats["committed_per_step"])
    return committed / stats["nfe"] if stats["nfe"] else 0.0


def padded(tokens, full: int, eos_id: int) -> torch.Tensor:
    """A reference row cut after its EOS, continued with EOS to ``full`` positions (the native
    engine's canvas row)."""
    tokens = list(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)
    return torch.tensor(tokens + [eos_id] * (full - len(tokens)), dtype=torch.long)


def dream_reference(model, prompt: torch.Tensor, o, vocab_limit: int | None):
    """Dream's reference decoders (``reference.dream``, Dream's defaults from the options table)."""
    from ..reference.dream import decode_with_options

    r = decode_with_options(model, prompt.tolist(), o, vocab_limit)
    return padded(r.tokens, prompt.numel() + o.gen_length, model.config.eos_token_id), r.nfe
