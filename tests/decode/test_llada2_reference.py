"""The LLaDA2 reference (``blockbatch.reference.llada2``): the model's parts against their spec, and
the ``block`` decoder (LLaDA2.0, LLaDA2.1 with editing) against recorded runs of the authors' own
model and ``generate`` (``tests/tools/record_authors_llada2.py``), token for token and NFE for NFE."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from blockbatch.reference import llada2 as ref
from helpers.llada2 import MOE, reference_case_decode, tiny_config

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "authors_llada2_random.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]


def _tiny(**over) -> ref.LLaDA2Config:
    return tiny_config(**{**MOE, "first_k_dense_replace": 1, **over})


def _decode(case: dict, cache: bool) -> tuple[torch.Tensor, dict]:
    """The reference decode of a recorded case."""
    torch.set_num_threads(1)
    cfg = ref.LLaDA2Config(**case["config"])
    model = ref.LLaDA2Reference(cfg, ref.random_weights(cfg, case["seed"], logit_scale=case["logit_scale"]))
    return reference_case_decode(model, case, cache)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_block_decoder_equals_the_authors(case):
    """Generated tokens (up to the first EOS, as the authors return them) and the number of forwards."""
    canvas, stats = _decode(case, cache=False)
    assert ref.generated_text_ids(canvas, len(case["prompt"]), case["eos_id"]) == case["generated"]
    assert stats["nfe"] == case["nfe"] == sum(stats["forwards_per_block"])
    assert case["max_logit_diff"] < 1e-5  # the recorded authors' model computed the same logits


def test_the_fixture_covers_the_rules():
    """The recorded cases reach what they are there for: both versions, editing that edits, EOS
    stops (LLaDA2.0's early return among them), dense and MoE layers, blocks of 16 and 32."""
    assert {c["version"] for c in CASES} == {"2.0", "2.1"}
    assert any(c["early_return"] for c in CASES)
    assert any(c["version"] == "2.1" and len(c["generated"]) < c["gen_length"] for c in CASES)
    assert {c["options"]["block_length"] for c in CASES} == {16, 32}
    assert any(c["config"]["num_experts"] is None for c in CASES) and any(c["config"]["num_experts"] for c in CASES)


def test_editing_edits_and_ends_blocks_on_a_quiet_step():
    cfg = _tiny()
    model = ref.LLaDA2Reference(cfg, ref.random_weights(cfg, 1, logit_scale=6.0))
    prompt = torch.tensor([5, 9, 11, 2, 7])
    plain, s0 = ref.block_generate(
        model, prompt, gen_length=32, block_length=16, steps=16, threshold=0.6, eos_id=62, mask_id=63
    )
    edited, s1 = ref.block_generate(
        model,
        prompt,
        gen_length=32,
        block_length=16,
        steps=16,
        threshold=0.6,
        edit_threshold=0.5,
        max_post_steps=3,
        eos_id=62,
        mask_id=63,
    )
    assert s0["edits"] == 0 and s1["edits"] > 0
    assert not (edited == 63).any() and not (plain == 63).any()
    assert torch.equal(edited[:5], prompt)  # the prompt is never edited
    # at most max_post_steps + 1 mask-free forwards per block, after the masked ones
    assert all(n <= 16 + 4 for n in s1["forwards_per_block"])


def test_block_causal_attention():
    """A block's logits depend on its own block and the earlier ones only; inside a block every
    position sees every other."""
    cfg = _tiny()
    model = ref.LLaDA2Reference(cfg, ref.random_weights(cfg, 2))
    ids = torch.randint(0, 60, (24,), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[17] = (ids[17] + 1) % 60
    a, b = model.forward(ids, 8), model.forward(changed, 8)
    assert torch.equal(a[:16], b[:16])
    assert not torch.allclose(a[16], b[16])  # position 16 sees 17: same block
    assert not torch.equal(model.forward(ids, None)[:16], a[:16])  # without the mask the future is seen


def test_routing_follows_the_spec():
    """Group-limited top-k, written out per token: groups of consecutive experts ranked by the sum
    of their two best biased scores, the best topk_group groups, the best experts in them; weights
    are the raw sigmoid scores normalised and scaled."""
    cfg = _tiny(num_experts=12, n_group=4, topk_group=2, num_experts_per_tok=3, routed_scaling_factor=2.5)
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(20, 12, generator=g), 0.3 * torch.randn(12, generator=g)
    chosen, weights = ref.route(cfg, logits, bias)
    for t in range(20):
        s = torch.sigmoid(logits[t])
        biased = (s + bias).tolist()
        groups = sorted(range(4), key=lambda j: -sum(sorted(biased[3 * j : 3 * j + 3])[-2:]))[:2]
        allowed = [e for j in groups for e in range(3 * j, 3 * j + 3)]
        best = sorted(allowed, key=lambda e: -biased[e])[:3]
        assert chosen[t].tolist() == best
        raw = s[best]
        assert torch.allclose(weights[t], raw / raw.sum() * 2.5)


def test_partial_rotary_leaves_the_other_dims():
    cos, sin = ref.rope_cos_sin(10, 4, 10000.0)
    x = torch.randn(2, 10, 8)
    r = 4
    rotated = torch.cat([x[..., :r] * cos + ref.rotate_half(x[..., :r]) * sin, x[..., r:]], dim=-1)
    assert torch.equal(rotated[..., r:], x[..., r:]) and torch.equal(rotated[:, 0], x[:, 0])  # position 0: no turn
    assert (
        ref.LLaDA2Config.from_dict(
            {
                "vocab_size": 8,
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }
        ).rope_dim
        == 4
    )


def test_transfer_schedule():
    assert ref.transfer_schedule(32, 32) == [1] * 32
    assert ref.transfer_schedule(32, 5) == [7, 7, 6, 6, 6] and sum(ref.transfer_schedule(30, 7)) == 30


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_exact_block_cache_decodes_the_same(case):
    """With the block cache (finished blocks' K/V kept, written in the next block's first forward,
    the prompt's complete blocks prefilled in the first one) the decode equals the authors' recorded
    one, token for token and NFE for NFE, and a forward runs the current block only, except the first
    of a block (the previous block too; and the prompt's complete blocks in the very first)."""
    canvas, stats = _decode(case, cache=True)
    P, B = len(case["prompt"]), case["options"]["block_length"]
    assert ref.generated_text_ids(canvas, P, case["eos_id"]) == case["generated"]
    assert stats["nfe"] == case["nfe"]
    expected, first = [], (P // B) * B + B  # the first forward: prompt blocks + the first decoded block
    for i, n in enumerate(stats["forwards_per_block"]):
        expected += [first if i == 0 else 2 * B] + [B] * (n - 1)
    assert stats["query_tokens"] == expected[: stats["nfe"]]


def test_the_cache_holds_the_keys_a_full_forward_computes():
    """forward_window over a cache of earlier blocks gives the logits of the full block-causal forward."""
    cfg = _tiny()
    model = ref.LLaDA2Reference(cfg, ref.random_weights(cfg, 4))
    ids = torch.randint(0, 60, (40,), generator=torch.Generator().manual_seed(1))
    full = model.forward(ids, 8)
    _, kv = model.forward_window(ids[:24], 0, 8, None)
    window, _ = model.forward_window(ids[24:], 24, 8, kv)
    assert torch.allclose(window, full[24:], atol=1e-5)


# config.json of inclusionAI/LLaDA2.0-mini as published (the keys the forward reads, and some it does not)
MINI = {
    "architectures": ["LLaDA2MoeModelLM"],
    "model_type": "llada2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "head_dim": 128,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "moe_intermediate_size": 512,
    "first_k_dense_replace": 1,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000,
    "rms_norm_eps": 1e-06,
    "routed_scaling_factor": 2.5,
    "vocab_size": 157184,
    "pad_token_id": 156892,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_bias": False,
    "norm_topk_prob": True,
    "score_function": "sigmoid",
    "hidden_act": "silu",
}


def test_the_published_mini_shape():
    """LLaDA2.0-mini read from its config.json: about 16B parameters, about 1.4B active per token
    (one dense layer, 19 MoE layers of 256 experts with 8 routed + 1 shared active), 40 KiB of bf16
    K/V per token, RoPE on 64 of 128 dims."""
    cfg = ref.LLaDA2Config.from_dict(MINI)
    ref.cfg_ok(cfg)
    shapes = ref.weight_shapes(cfg)
    count = {name: int(torch.Size(s).numel()) for name, s in shapes.items()}
    total = sum(count.values())
    routed = sum(n for name, n in count.items() if ".mlp.experts." in name)
    active = total - routed + routed * cfg.num_experts_per_tok // cfg.num_experts
    assert 16.0e9 < total < 16.5e9 and 1.35e9 < active < 1.5e9, (total, active)
    kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
    assert kv_bytes_per_token == 40 * 1024 and cfg.rope_dim == 64
    assert not cfg.is_moe(0) and cfg.is_moe(1) and "model.layers.0.mlp.gate_proj.weight" in shapes
    # embeddings; 6 tensors a layer's attention and norms; one dense MLP; 19 x (router, expert bias, 256
    # experts and the shared one of 3 tensors each); final norm; LM head
    assert "model.layers.0.attention.dense.bias" not in shapes
    assert len(shapes) == 1 + 20 * 6 + 3 + 19 * (2 + 3 * 257) + 1 + 1
