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


def case_options(case: dict):
    """The DecodeOptions (policy block) of a recorded authors' case (tests/fixtures/authors_llada2_*.json)."""
    from blockbatch import DecodeOptions

    o = case["options"]
    return DecodeOptions(
        policy="block",
        gen_length=case["gen_length"],
        block_length=o["block_length"],
        steps=o["steps"],
        threshold=o["threshold"],
        edit_threshold=o.get("edit_threshold"),
        max_post_steps=o.get("max_post_steps", 16),
        stop_on_eos=o.get("stop_on_eos", False),
    )


def reference_case_decode(model, case: dict, cache: bool = True):
    """The reference block decode (canvas, stats) of a recorded case's prompt and options on ``model``."""
    import torch

    o = case_options(case)
    return ref.block_generate(
        model,
        torch.tensor(case["prompt"]),
        gen_length=o.gen_length,
        block_length=o.block_length,
        steps=o.steps,
        threshold=o.threshold,
        edit_threshold=o.edit_threshold,
        max_post_steps=o.max_post_steps,
        stop_on_eos=bool(o.stop_on_eos),
        eos_id=case["eos_id"],
        mask_id=case["mask_id"],
        cache=cache,
    )


def native_case_decode(model_obj, case: dict):
    """The native decode (canvas, stats dict) of a recorded case's prompt and options."""
    import torch

    out = torch.ops.blockbatch.decode(model_obj, torch.tensor(case["prompt"]), case_options(case).native)
    return out[0], dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
