"""Random checkpoints of any family and shape, in the exact Hugging Face layout of the family
(``blockbatch.families``): ``blockbatch make-random``, the benchmarks and the tests build their
models from these. The weights are random: such a checkpoint exercises loading, the forward and
the decoders at a given shape, never answers anything."""

from __future__ import annotations

import math
import os

import torch

from . import families
from .config import ModelConfig
from .loading import save_checkpoint


def random_config(family: str = "llada", **overrides) -> ModelConfig:
    """A small valid config of ``family``; any field can be overridden."""
    return families.get(family).random_config(**overrides)


def random_weights(
    config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, logit_scale: float = 1.0, **family_options
) -> dict[str, torch.Tensor]:
    """Gaussian weights of ``config``'s family, scaled by 1/sqrt(fan_in), norms near 1;
    ``logit_scale`` multiplies the LM head (larger: peaked softmaxes, so threshold rules commit
    several tokens a step). ``family_options``: the family's own (Dream: ``bias_scale``)."""
    for name, value in {"logit_scale": logit_scale, **family_options}.items():
        if isinstance(value, float) and not math.isfinite(value):  # NaN / Inf weights decode garbage
            raise ValueError(f"{name} must be a finite number, got {value}")
    return families.of(config).random_weights(config, seed, dtype, logit_scale, **family_options)


def make_random_checkpoint(
    path: str | os.PathLike,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    logit_scale: float = 1.0,
    max_shard_bytes: int | None = None,
    tokenizer=None,
    family: str = "llada",
    chat_template: str | None = None,
    **config_overrides,
) -> ModelConfig:
    """Write a random checkpoint folder of ``family`` at ``path`` and return its config (with
    ``tokenizer``, a ``tokenizers.Tokenizer``, and ``chat_template`` when given: for a byte-level
    BPE one, ``random_tokenizer.build_bpe_tokenizer`` and ``random_tokenizer.CHAT_TEMPLATE``)."""
    config = random_config(family, **config_overrides)
    save_checkpoint(
        path,
        config,
        random_weights(config, seed, dtype, logit_scale),
        tokenizer=tokenizer,
        chat_template=chat_template,
        max_shard_bytes=max_shard_bytes,
    )
    return config
