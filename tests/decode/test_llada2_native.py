"""The native LLaDA2 family (its row in csrc/model/families.cpp, the body csrc/model/transformer.cpp,
policy 'block' in csrc/decode/policies/block.cpp)
against the float32 reference (python/blockbatch/reference/llada2.py) and the authors' recorded runs:
logits within 1e-4, tokens, NFE and edits exactly."""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions, Engine
from blockbatch.config import ModelConfig
from blockbatch.families import llada2 as fam
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import make_random_checkpoint, random_config, random_weights
from blockbatch.reference import llada2 as ref
from helpers.llada2 import native_case_decode

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "authors_llada2_random.json"
CASES = json.loads(FIXTURE.read_text(encoding="utf-8"))["cases"]

# Shapes: GQA with partial rotary and MoE groups (the default), full rotary, dense only, biases on
# q/k/v and the output, tied embeddings, no QK-norm, one expert a token, no shared expert.
SHAPES = {
    "moe-gqa": dict(),
    "full-rotary": dict(rope_dims=16, n_layers=3),
    "dense": dict(num_experts=0, first_dense_layers=0),
    "biases-tied": dict(attention_bias=True, attn_out_bias=True, weight_tying=True),
    "no-qk-norm-top1": dict(qk_norm=False, experts_per_token=1, shared_experts=0, first_dense_layers=0),
    "groups-16": dict(num_experts=16, expert_groups=8, expert_groups_kept=3, experts_per_token=4, n_kv_heads=1),
}


def _model(shape: str, seed: int = 0, logit_scale: float = 4.0):
    fields = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16)
    cfg = random_config("llada2", **{**fields, **SHAPES[shape]})
    weights = random_weights(cfg, seed=seed, logit_scale=logit_scale)
    return cfg, NativeModel(cfg, weights), ref.LLaDA2Reference(fam.reference_config(cfg), weights)


def _block_rows(start: int, end: int, block: int):
    """Query rows of [start, end), one per block (block-aligned), and each row's keys: up to its block's end."""
    bounds = list(range(start, end, block))
    return torch.tensor([0] + [b + block - start for b in bounds]), torch.tensor([b + block for b in bounds])


@pytest.mark.parametrize("shape", SHAPES)
def test_forward_equals_the_reference(shape):
    """Bidirectional (one row, no cache) and block-causal (a row per block over one KV row, dual mode)
    logits of the native forward within 1e-4 of the reference's."""
    cfg, model, reference = _model(shape)
    ids = torch.randint(0, 60, (48,), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(48)
    native = torch.ops.blockbatch.forward(model.obj, ids, pos, torch.tensor([0, 48]))
    assert (native - reference.forward(ids, None)).abs().max() < 1e-4
    for block in (8, 16):
        cu, kv_lens = _block_rows(0, 48, block)
        kv = model.new_kv(1, 64)
        rows = torch.zeros(len(kv_lens), dtype=torch.long)
        out = torch.ops.blockbatch.forward(model.obj, ids, pos, cu, kv, rows, None, "dual", None, kv_lens)
        assert (out - reference.forward(ids, block)).abs().max() < 1e-4, block
        # the cache is exact: the last block again, over the cached keys, gives the same logits
        last = 48 - block
        again = torch.ops.blockbatch.forward(
            model.obj, ids[last:], pos[last:], torch.tensor([0, block]), kv, rows[:1], None, "dual", None, kv_lens[-1:]
        )
        assert (again - out[last:]).abs().max() < 1e-5


# A token's logits whichever tokens share its forward (its experts' GEMMs): every family's body in
# tests/ops/test_batch_invariance.py (LLaDA2's row: 16 experts in 8 groups).


GRID = list(
    itertools.product(
        ["moe-gqa", "dense", "groups-16"],  # shape
        [3, 16, 21],  # prompt length: inside the first block, on a block boundary, past it
        [8, 16, 32],  # block_length
        [None, 0.5],  # edit_threshold: LLaDA2.0 / 2.1
    )
)


@pytest.mark.parametrize("shape,prompt_len,block,edit", GRID)
def test_block_decode_equals_the_reference(shape, prompt_len, block, edit):
    """Tokens, forwards and edits of the native block decoder equal the reference's exact-cache decode,
    which equals the authors' (tests/decode/test_llada2_reference.py), on several shapes, prompt
    lengths, block lengths, with and without editing, EOS stops on and off."""
    cfg, model, reference = _model(shape, seed=prompt_len + block)
    prompt = torch.randint(0, 60, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len))
    for gen, steps, threshold, stop in ((40, None, 0.95, False), (24, 4, 0.5, True)):
        canvas, st = ref.block_generate(
            reference,
            prompt,
            gen_length=gen,
            block_length=block,
            steps=steps or block,
            threshold=threshold,
            edit_threshold=edit,
            stop_on_eos=stop,
            eos_id=cfg.eos_token_id,
            mask_id=cfg.mask_token_id,
            cache=True,
        )
        o = DecodeOptions(
            policy="block",
            gen_length=gen,
            block_length=block,
            steps=steps,
            threshold=threshold,
            edit_threshold=edit,
            stop_on_eos=stop,
        )
        out = torch.ops.blockbatch.decode(model.obj, prompt, o.native)
        stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
        what = f"gen {gen}, steps {steps}, threshold {threshold}, stop_on_eos {stop}"
        assert out[0].tolist() == canvas.tolist(), what
        assert (stats["nfe"], stats["edits"]) == (st["nfe"], st["edits"]), what


def test_the_grid_reaches_editing_and_several_blocks():
    """The grid above is not vacuous: editing edits, decodes span several blocks and EOS stops one."""
    edits, blocks = 0, 0
    for shape, prompt_len, block in (("moe-gqa", 3, 8), ("dense", 16, 8), ("moe-gqa", 21, 16)):
        cfg, _, reference = _model(shape, seed=prompt_len + block)
        prompt = torch.randint(0, 60, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len))
        _, st = ref.block_generate(
            reference,
            prompt,
            gen_length=40,
            block_length=block,
            steps=block,
            threshold=0.95,
            edit_threshold=0.5,
            eos_id=cfg.eos_token_id,
            mask_id=cfg.mask_token_id,
            cache=True,
        )
        edits += st["edits"]
        blocks = max(blocks, len(st["forwards_per_block"]))
    assert edits > 0 and blocks >= 4


@pytest.mark.parametrize("edit", [None, 0.5])
@pytest.mark.parametrize("stop_on_eos", [False, True])
def test_eos_ends_the_decode_as_in_the_reference(edit, stop_on_eos):
    """With the EOS id a token the model writes early, the decode ends blocks early as the reference
    does (LLaDA2.0 at a block holding EOS, its early return with stop_on_eos; LLaDA2.1 with
    stop_on_eos on a mask-free block holding EOS): the same canvas, forwards and edits."""
    cfg, model, reference = _model("moe-gqa", seed=4)
    prompt = torch.tensor([5, 6, 7])
    kw = dict(gen_length=64, block_length=8, steps=8, threshold=0.5, edit_threshold=edit, mask_id=cfg.mask_token_id)
    canvas, _ = ref.block_generate(reference, prompt, eos_id=cfg.eos_token_id, cache=True, **kw)
    eos = int(canvas[12])  # a token of the second block
    config = random_config("llada2", vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, head_size=16, eos_token_id=eos)
    model = NativeModel(config, random_weights(config, seed=4, logit_scale=4.0))
    canvas, st = ref.block_generate(reference, prompt, eos_id=eos, stop_on_eos=stop_on_eos, cache=True, **kw)
    # it stopped before the last block, except LLaDA2.1 without stop_on_eos (which decodes every block)
    assert (len(st["forwards_per_block"]) < 9) == (edit is None or stop_on_eos)
    o = DecodeOptions(
        policy="block",
        gen_length=64,
        block_length=8,
        steps=8,
        threshold=0.5,
        edit_threshold=edit,
        stop_on_eos=stop_on_eos,
    )
    out = torch.ops.blockbatch.decode(model.obj, prompt, o.native)
    stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
    assert out[0].tolist() == canvas.tolist()
    assert (stats["nfe"], stats["edits"]) == (st["nfe"], st["edits"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_native_equals_the_authors(case):
    """The authors' own generate (LLaDA2.0 and 2.1, recorded from a fetched copy of their files): the
    native block decoder gives the same generation and the same number of forwards."""
    raw = {
        **case["config"],
        "model_type": "llada2_moe",
        "mask_token_id": case["mask_id"],
        "eos_token_id": case["eos_id"],
        "max_position_embeddings": 512,
    }
    config = ModelConfig.from_dict(raw)
    cfg = ref.LLaDA2Config(**case["config"])
    model = NativeModel(config, ref.random_weights(cfg, case["seed"], logit_scale=case["logit_scale"]))
    canvas, stats = native_case_decode(model.obj, case)
    assert ref.generated_text_ids(canvas, len(case["prompt"]), case["eos_id"]) == case["generated"]
    assert stats["nfe"] == case["nfe"]


def test_whole_blocks_past_max_sequence_length_are_refused(tmp_path):
    """The block policy's canvas is whole blocks: 999 positions take blocks to 1024, refused before the
    decode by the one admission rule (admit), which names the rounding. (The policies LLaDA2 does not
    decode, its refused options and defaults, and 'block' on bidirectional families: test_family_decode.py.)"""
    make_random_checkpoint(tmp_path / "l2", family="llada2", vocab_size=64, logit_scale=4.0, max_sequence_length=1000)
    engine = Engine.from_pretrained(str(tmp_path / "l2"))
    # Python's length check asks admit, so it names the rounding too.
    with pytest.raises(
        ValueError,
        match=r"needs 1024 positions \(rounded up to whole blocks of block_length\) but the model's "
        r"max_sequence_length is 1000",
    ):
        engine.generate([[1] * 10], DecodeOptions(policy="block", gen_length=989))
    # The C++ rule says the same where Python's check is not in front of it (the scheduler).
    with engine.scheduler(max_batch=1, max_length=1000, adaptive=False) as sched:
        with pytest.raises(ValueError, match=r"rounded up to a whole block .* exceeds max_sequence_length"):
            sched.submit(torch.tensor([1] * 10), DecodeOptions(policy="block", gen_length=989))


def test_loading_the_published_layout(tmp_path):
    """The published LLaDA2.0-mini config.json reads into the family's fields (16.3B parameters, one
    tensor count for loader and C++); a sharded random checkpoint loads; a missing expert tensor, a
    bad key and a foreign score function are errors naming the file, tensor or key."""
    from blockbatch import families
    from blockbatch.errors import CheckpointError
    from decode.test_llada2_reference import MINI

    config = ModelConfig.from_dict(MINI)
    assert (config.family, config.head_dim, config.rope_dim, config.num_experts, config.first_dense_layers) == (
        "llada2",
        128,
        64,
        256,
        1,
    )
    assert (config.mask_token_id, config.eos_token_id) == (fam.AUTHORS_MASK_ID, fam.AUTHORS_EOS_ID)
    shapes = families.weight_shapes(config)
    assert families.tensor_count(config) == len(shapes) == 14813
    assert 16.0e9 < sum(torch.Size(s).numel() for s in shapes.values()) < 16.5e9
    assert {k: getattr(config, k) for k in fam.LLADA2_MINI} == fam.LLADA2_MINI
    folder = tmp_path / "sharded"
    make_random_checkpoint(folder, family="llada2", vocab_size=64, n_layers=3, max_shard_bytes=200_000)
    assert (folder / "model.safetensors.index.json").exists()
    engine = Engine.from_pretrained(str(folder))
    assert engine.config.family == "llada2" and engine.generate([[1, 2, 3]], engine.default_options(gen_length=8))
    import json as _json

    from safetensors.torch import load_file, save_file

    index = _json.loads((folder / "model.safetensors.index.json").read_text())
    name = "model.layers.2.mlp.experts.5.up_proj.weight"
    shard = folder / index["weight_map"][name]
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard)
    del index["weight_map"][name]
    (folder / "model.safetensors.index.json").write_text(_json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{name}.*mixtures of experts"):
        Engine.from_pretrained(str(folder))
    for key, value, match in (
        ("score_function", "softmax", r"config.json: key 'score_function' is 'softmax'; LLaDA2 checkpoints use"),
        ("n_group", 3, r"config.json: key 'n_group' = 3 must divide num_experts = 8"),
        ("partial_rotary_factor", 1.5, r"config.json: key 'partial_rotary_factor' must be a number in \(0, 1\]"),
    ):
        raw = _json.loads((folder / "config.json").read_text())
        bad = tmp_path / f"bad-{key}"
        bad.mkdir()
        (bad / "config.json").write_text(_json.dumps({**raw, key: value}))
        with pytest.raises(CheckpointError, match=match):
            ModelConfig.from_json_file(bad / "config.json")
