"""Small LLaDA2 configurations of the reference tests and of the authors' recorder."""

from __future__ import annotations

from blockbatch.reference import llada2 as ref

MOE = dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1)


def tiny_config(**over) -> ref.LLaDA2Config:
    """A two-layer LLaDA2 shape (4 query heads over 2 KV heads of 8 dims, vocabulary 64), with ``over``."""
    fields = dict(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=16,
        use_bias=True,
        use_qkv_bias=False,
    )
    fields.update(over)
    return ref.LLaDA2Config(**fields)
