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


def toy_tokenizer_checkpoint(folder, seed: int = 2):
    """A random LLaDA2 checkpoint with the toy's vocabulary, special ids and tokenizer (so text
    prompts work): a dense layer, then 8 experts top-2 + shared; 3 layers of d_model 64."""
    import shutil
    from pathlib import Path

    from blockbatch.config import ModelConfig
    from blockbatch.random_checkpoint import make_random_checkpoint
    from blockbatch.toy import checkpoint_path

    toy = ModelConfig.from_json_file(Path(checkpoint_path()) / "config.json")
    make_random_checkpoint(
        folder,
        family="llada2",
        seed=seed,
        logit_scale=4.0,
        vocab_size=toy.vocab_size,
        mask_token_id=toy.mask_token_id,
        eos_token_id=toy.eos_token_id,
        d_model=64,
        n_layers=3,
    )
    shutil.copy(Path(checkpoint_path()) / "tokenizer.json", Path(folder) / "tokenizer.json")
    return folder
