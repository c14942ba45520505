"""Random LLaDA checkpoints of any shape, in the exact HF layout: ``blockbatch make-random``, the
benchmarks and the tests build their models from these."""

from __future__ import annotations

import os

import torch

from .config import ModelConfig
from .loading import expected_weight_shapes, save_checkpoint


def random_config(**overrides) -> ModelConfig:
    """A small valid LLaDA config; any field can be overridden."""
    fields = dict(
        d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden_size=128, vocab_size=97,
        embedding_size=None, rope_theta=10000.0, rms_norm_eps=1e-5, weight_tying=False,
        mask_token_id=None, eos_token_id=None, max_sequence_length=1024,
    )
    fields.update(overrides)
    if fields["embedding_size"] is None:
        fields["embedding_size"] = fields["vocab_size"]
    if fields["mask_token_id"] is None:
        fields["mask_token_id"] = fields["vocab_size"] - 1
    if fields["eos_token_id"] is None:
        fields["eos_token_id"] = fields["vocab_size"] - 2
    fields.setdefault("pad_token_id", fields["eos_token_id"])
    return ModelConfig(**fields).validate()


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                   logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in); norms near 1.

    ``logit_scale`` multiplies the LM head so that tests can make the model more or less
    confident (a larger scale gives peaked softmaxes, so threshold rules commit several tokens).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in expected_weight_shapes(config).items():
        if len(shape) == 1:  # norm weights
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("wte.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name.endswith("transformer.ff_out.weight"):
                t = t * logit_scale
        weights[name] = t.to(dtype)
    return weights


def make_random_checkpoint(path: str | os.PathLike, seed: int = 0, dtype: torch.dtype = torch.float32,
                           logit_scale: float = 1.0, max_shard_bytes: int | None = None,
                           tokenizer=None, **config_overrides) -> ModelConfig:
    """Write a random checkpoint folder at ``path`` and return its config."""
    config = random_config(**config_overrides)
    save_checkpoint(path, config, random_weights(config, seed, dtype, logit_scale), tokenizer=tokenizer,
                    max_shard_bytes=max_shard_bytes)
    return config
