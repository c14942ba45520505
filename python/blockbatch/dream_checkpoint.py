"""Random Dream-family checkpoints in the exact Hugging Face Dream layout (tests, benchmarks).

The Dream twin of ``blockbatch.random_checkpoint.make_random_checkpoint``: a ``config.json`` with
``model_type: "Dream"`` (Qwen2 key names), a ``generation_config.json`` and the weights under
Dream's names, q/k/v biases included (``blockbatch.loading.dream_weight_shapes``).
"""

from __future__ import annotations

import os

import torch

from .config import ModelConfig
from .loading import dream_weight_shapes, save_checkpoint

# The shape of Dream-v0-Base-7B / Dream-v0-Instruct-7B (config.json as published).
DREAM_7B = dict(d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, mlp_hidden_size=18944, vocab_size=152064,
                rope_theta=1000000.0, rms_norm_eps=1e-6, mask_token_id=151666, eos_token_id=151643,
                pad_token_id=151643, bos_token_id=151643, max_sequence_length=131072)


def random_dream_config(**overrides) -> ModelConfig:
    """A small valid Dream config (GQA: 4 query heads over 2 KV heads); any field can be overridden."""
    fields = dict(
        d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=128, vocab_size=97,
        rope_theta=1000000.0, rms_norm_eps=1e-6, weight_tying=False,
        mask_token_id=None, eos_token_id=None, max_sequence_length=131072,
    )
    fields.update(overrides)
    fields.setdefault("embedding_size", fields["vocab_size"])
    if fields["mask_token_id"] is None:
        fields["mask_token_id"] = fields["vocab_size"] - 1
    if fields["eos_token_id"] is None:
        fields["eos_token_id"] = fields["vocab_size"] - 2
    fields.setdefault("pad_token_id", fields["eos_token_id"])
    fields.setdefault("bos_token_id", fields["eos_token_id"])
    return ModelConfig(model_type="Dream", attention_bias=True, **fields).validate()


def random_dream_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                         logit_scale: float = 1.0, bias_scale: float = 0.1) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in), norms near 1, small q/k/v biases.

    ``logit_scale`` multiplies ``lm_head`` (larger: more peaked softmaxes, so threshold rules
    commit several tokens a step).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in dream_weight_shapes(config).items():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            t = bias_scale * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name == "lm_head.weight":
                t = t * logit_scale
                # The mask id's row is zero: its logit stays 0 while the largest of the others is
                # well above, so a random model never proposes the mask id (a trained Dream does not
                # either; the authors' vanilla and Fast-dLLM decoders would write it back, and their
                # cached block loop would never end).
                t[config.mask_token_id] = 0.0
        weights[name] = t.to(dtype)
    return weights


def make_random_dream_checkpoint(path: str | os.PathLike, seed: int = 0, dtype: torch.dtype = torch.float32,
                                 logit_scale: float = 1.0, max_shard_bytes: int | None = None,
                                 tokenizer=None, **config_overrides) -> ModelConfig:
    """Write a random Dream checkpoint folder at ``path`` and return its config."""
    config = random_dream_config(**config_overrides)
    save_checkpoint(path, config, random_dream_weights(config, seed, dtype, logit_scale), tokenizer=tokenizer,
                    max_shard_bytes=max_shard_bytes)
    return config
