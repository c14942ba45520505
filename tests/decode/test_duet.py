"""DUET (docs/ALGORITHMS.md 18; issue 55) on policy 'block':

- the reference (reference/duet.py) with nothing dropped (a budget covering the prefix, ratio 1.0) is the
  block decode: canvas and NFE of reference/llada2.py and reference/sdar.py block_generate, on the authors'
  recorded LLaDA2 cases and the LLaDA2 / SDAR toys;
- its selection rule against a brute-force reading of the rule;
- the native prefix K/V sparsity: with a budget covering the prefix the native decode is the dense one
  (tokens, NFE, keys read); with small budgets that drop keys it equals the reference in tokens, NFE and the
  selected-key count, and reads fewer keys per step;
- the reference's query pruning drops rows and still finishes every block;
- the native query pruning (LLaDA2 toy, its editing toy, SDAR toy) equals the reference in tokens, NFE, edits
  and dropped rows, alone and with the prefix part; ratio 1.0 and its gates are the dense decode; a pruning
  request's result does not depend on its batch;
- refusals name the option.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import pytest
import torch

from blockbatch import DecodeOptions, toy
from blockbatch.config import ModelConfig
from blockbatch.decoding import run_decode
from blockbatch.errors import RequestError
from blockbatch.families import llada2 as fam
from blockbatch.families import sdar as sdar_fam
from blockbatch.loading import load_checkpoint
from blockbatch.native import NativeModel
from blockbatch.reference import duet
from blockbatch.reference import llada2 as ref
from blockbatch.reference import sdar as sdar_ref
from helpers.llada2 import case_options

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
CASES = [
    (kind, case)
    for kind in ("toy", "random")
    for case in json.loads((FIXTURES / f"authors_llada2_{kind}.json").read_text(encoding="utf-8"))["cases"]
]
IDS = [f"{k}-{c['name']}" for k, c in CASES]
DENSE = {"prefix_kv_budget": 1 << 20, "prefix_kv_min_context": 0, "query_keep_ratio": 1.0}


def _native_decode(model_obj, prompt, o: DecodeOptions):
    out = run_decode(model_obj, torch.as_tensor(prompt), o)
    return out.tokens.tolist(), out.stats, out


@pytest.fixture(scope="module")
def llada2_toy():
    ckpt = load_checkpoint(toy.checkpoint_path("llada2"))
    c = ckpt.config
    reference = ref.LLaDA2Reference(fam.reference_config(c), ckpt.weights, c.mask_token_id, c.eos_token_id)
    return NativeModel(c, ckpt.weights), reference


@pytest.fixture(scope="module")
def sdar_toy():
    ckpt = load_checkpoint(toy.checkpoint_path("sdar"))
    c = ckpt.config
    reference = sdar_ref.SDARReference(sdar_fam.reference_config(c), ckpt.weights, c.mask_token_id, c.eos_token_id)
    return c, NativeModel(c, ckpt.weights), reference


def _case_models(case, llada2_toy, kind):
    if kind == "toy":
        return llada2_toy
    raw = {
        **case["config"],
        "model_type": "llada2_moe",
        "mask_token_id": case["mask_id"],
        "eos_token_id": case["eos_id"],
        "max_position_embeddings": 512,
    }
    cfg = ref.LLaDA2Config(**case["config"])
    weights = ref.random_weights(cfg, case["seed"], logit_scale=case["logit_scale"])
    return NativeModel(ModelConfig.from_dict(raw), weights), ref.LLaDA2Reference(
        cfg, weights, case["mask_id"], case["eos_id"]
    )


def _ref_options(case) -> dict:
    o = case_options(case)
    return dict(
        gen_length=o.gen_length,
        block_length=o.block_length,
        steps=o.steps,
        threshold=o.threshold,
        edit_threshold=o.edit_threshold,
        max_post_steps=o.max_post_steps,
        stop_on_eos=o.stop_on_eos,
        eos_id=case["eos_id"],
        mask_id=case["mask_id"],
    )


@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_reference_with_nothing_dropped_is_the_block_decode(llada2_toy, kind, case):
    """The authors' recorded LLaDA2 cases: a budget covering the prefix and ratio 1.0 give the canvas and
    NFE of the block decode (reference/llada2.py block_generate with its exact cache)."""
    reference = _case_models(case, llada2_toy, kind)[1]
    prompt = torch.tensor(case["prompt"])
    dense, dense_stats = ref.block_generate(reference, prompt, cache=True, **_ref_options(case))
    sparse, stats = duet.duet_generate(reference, prompt, duet=DENSE, **_ref_options(case))
    assert sparse.tolist() == dense.tolist()
    assert stats["nfe"] == dense_stats["nfe"] and stats["edits"] == dense_stats["edits"]
    assert stats["prefix_keys_selected"] == 0 and stats["query_rows_dropped"] == 0


def _sdar_prompts(cfg):
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, cfg.eos_token_id, (n,), generator=g) for n in (3, 9, 14)]


def test_reference_with_nothing_dropped_is_the_sdar_block_decode(sdar_toy):
    cfg, _, reference = sdar_toy
    for prompt in _sdar_prompts(cfg):
        kw = dict(gen_length=16, block_length=4, threshold=0.85, mask_id=cfg.mask_token_id, eos_id=cfg.eos_token_id)
        dense, dense_stats = sdar_ref.block_generate(reference, prompt, **kw)
        sparse, stats = duet.duet_generate(reference, prompt, duet=DENSE, **kw)
        assert sparse.tolist() == dense.tolist()
        assert stats["nfe"] == dense_stats["nfe"]


def test_selection_follows_the_rule():
    """select_prefix against a direct reading of 18.1: exactly the budget when there are more candidates;
    every (head, row)'s nearest candidate kept when the union fits the budget; the fill by best distance."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, B, hd, C = 4, 2, 3, 8, 40
    q, k = torch.randn(H, B, hd, generator=g), torch.randn(Hkv, C, hd, generator=g)
    cand = torch.arange(100, 100 + C)
    dist = torch.stack(
        [(q[h, i][None, :] - k[h // (H // Hkv)]).abs().sum(-1) for h in range(H) for i in range(B)]
    )  # [H B, C]
    for budget in (5, 12, 20, 39):
        chosen = duet.select_prefix(q, k, cand, budget)
        assert chosen.numel() == budget and chosen.tolist() == sorted(set(chosen.tolist()))
        local = math.ceil(budget / (H * B))
        union = set(dist.argsort(dim=1, stable=True)[:, :local].reshape(-1).tolist())
        best = dist.min(dim=0).values
        if len(union) <= budget:
            rest = sorted(set(range(C)) - union, key=lambda j: (float(best[j]), j))
            expect = union | set(rest[: budget - len(union)])
        else:
            expect = set(sorted(union, key=lambda j: (float(best[j]), j))[:budget])
        assert set((chosen - 100).tolist()) == expect, budget
    assert duet.select_prefix(q, k, cand, C).tolist() == cand.tolist()


def _native_options(case, **duet_options) -> DecodeOptions:
    return dataclasses.replace(case_options(case), **duet_options)


@pytest.mark.parametrize("kind,case", CASES, ids=IDS)
def test_native_with_a_covering_budget_is_the_dense_decode(llada2_toy, kind, case):
    model = _case_models(case, llada2_toy, kind)[0]
    tokens, stats, out = _native_decode(model.obj, case["prompt"], case_options(case))
    sparse_tokens, sparse_stats, sparse_out = _native_decode(
        model.obj, case["prompt"], _native_options(case, prefix_kv_budget=1 << 20, prefix_kv_min_context=0)
    )
    assert sparse_tokens == tokens and sparse_stats["nfe"] == stats["nfe"]
    assert sparse_stats["prefix_keys_selected"] == 0


LLADA2_SPARSE = [
    (budget, block, steps, edit) for budget in (4, 12) for block, steps in ((8, 8), (16, 4)) for edit in (None, 0.9)
]


@pytest.mark.parametrize("budget,block,steps,edit", LLADA2_SPARSE)
def test_native_prefix_sparsity_equals_the_reference_llada2(llada2_toy, budget, block, steps, edit):
    """The LLaDA2 toy with budgets that drop keys: native tokens, NFE, edits and selected keys equal the
    reference's; the sparse steps read fewer keys than the dense decode's."""
    model, reference = llada2_toy
    c = model.config
    g = torch.Generator().manual_seed(budget + block)
    for n in (21, 40):
        prompt = torch.randint(0, min(c.eos_token_id, c.mask_token_id), (n,), generator=g)
        o = DecodeOptions(
            policy="block",
            gen_length=32,
            block_length=block,
            steps=steps,
            threshold=1.0,  # one schedule share a step: the block has later steps
            edit_threshold=edit,
            prefix_kv_budget=budget,
            prefix_kv_min_context=0,
        )
        canvas, st = duet.duet_generate(
            reference,
            prompt,
            duet={"prefix_kv_budget": budget, "prefix_kv_min_context": 0},
            gen_length=32,
            block_length=block,
            steps=steps,
            threshold=1.0,  # one schedule share a step: the block has later steps
            edit_threshold=edit,
            eos_id=c.eos_token_id,
            mask_id=c.mask_token_id,
        )
        tokens, stats, _ = _native_decode(model.obj, prompt, o)
        assert st["prefix_keys_selected"] > 0
        assert tokens == canvas.tolist(), n
        assert stats["nfe"] == st["nfe"] and stats["edits"] == st["edits"]
        assert stats["prefix_keys_selected"] == st["prefix_keys_selected"]


def test_native_prefix_sparsity_reads_fewer_keys(llada2_toy):
    """key_tokens_per_step: a sparse step reads the budget and the block's own keys, the dense decode's
    the whole prefix and the block."""
    model, _ = llada2_toy
    prompt = [i % 19 for i in range(3, 43)]  # the toy: ids below its EOS (19) and mask (20)
    base = DecodeOptions(policy="block", gen_length=32, block_length=8, steps=8, threshold=0.9)
    _, dense, _ = _native_decode(model.obj, prompt, base)
    _, sparse, _ = _native_decode(
        model.obj, prompt, dataclasses.replace(base, prefix_kv_budget=4, prefix_kv_min_context=0)
    )
    assert sparse["prefix_keys_selected"] > 0
    assert sum(sparse["key_tokens_per_step"]) < sum(dense["key_tokens_per_step"])
    assert min(sparse["key_tokens_per_step"]) == 4 + 8  # a sparse step: the budget and the block's own keys


@pytest.mark.parametrize("budget", (2, 6))
def test_native_prefix_sparsity_equals_the_reference_sdar(sdar_toy, budget):
    cfg, model, reference = sdar_toy
    selected = 0
    for prompt in _sdar_prompts(cfg):
        kw = dict(gen_length=16, block_length=4, threshold=1.0)  # one commit a step: later steps exist
        canvas, st = duet.duet_generate(
            reference,
            prompt,
            duet={"prefix_kv_budget": budget, "prefix_kv_min_context": 0},
            mask_id=cfg.mask_token_id,
            eos_id=cfg.eos_token_id,
            **kw,
        )
        o = DecodeOptions(policy="block", prefix_kv_budget=budget, prefix_kv_min_context=0, **kw)
        tokens, stats, _ = _native_decode(model.obj, prompt, o)
        assert tokens == canvas.tolist()
        assert stats["nfe"] == st["nfe"]
        assert stats["prefix_keys_selected"] == st["prefix_keys_selected"]
        selected += st["prefix_keys_selected"]
    assert selected > 0  # some decode reached a sparse step (an early EOS may end one before)


def test_reference_query_pruning_drops_rows_and_finishes(llada2_toy):
    model, reference = llada2_toy
    c = model.config
    prompt = torch.arange(3, 43) % c.eos_token_id
    canvas, st = duet.duet_generate(
        reference,
        prompt,
        duet={
            "query_keep_ratio": 0.5,
            "query_dense_masks": 2,
            "prefix_kv_budget": 8,
            "prefix_kv_min_context": 0,
            "query_min_context": 0,
        },
        gen_length=32,
        block_length=16,
        steps=16,
        threshold=1.0,  # one commit a step: the block has later steps to prune
        eos_id=c.eos_token_id,
        mask_id=c.mask_token_id,
    )
    assert st["query_rows_dropped"] > 0 and st["prefix_keys_selected"] > 0
    decoded_end = (len(prompt) // 16 + len(st["forwards_per_block"])) * 16  # the blocks it decoded (EOS ends it)
    assert not (canvas[:decoded_end] == c.mask_token_id).any()


@pytest.mark.parametrize(
    "policy,option,value",
    [
        ("dual", "prefix_kv_budget", 64),
        ("vanilla", "query_keep_ratio", 0.5),
        ("blockbatch", "prefix_kv_min_context", 0),
        ("window", "query_dense_masks", 2),
        ("wavefront", "prefix_kv_budget", 8),
    ],
)
def test_other_policies_refuse_duet(policy, option, value):
    with pytest.raises(RequestError) as err:
        DecodeOptions(policy=policy, gen_length=16, block_length=8, **{option: value})
    assert (err.value.kind, err.value.param) == ("unsupported", option), str(err.value)
    assert "policy 'block'" in str(err.value)


@pytest.fixture(scope="module")
def llada2_edit_toy():
    ckpt = load_checkpoint(toy.SHIPPED_CHECKPOINT_DIRS["llada2 editing"])
    c = ckpt.config
    reference = ref.LLaDA2Reference(fam.reference_config(c), ckpt.weights, c.mask_token_id, c.eos_token_id)
    return NativeModel(c, ckpt.weights), reference


def _query_pair(model, reference, prompt, duet_options: dict, **kw):
    """The native decode and the reference's with the same DUET options: (tokens, stats), (canvas, stats)."""
    c = model.config
    canvas, st = duet.duet_generate(
        reference, prompt, duet=duet_options, eos_id=c.eos_token_id, mask_id=c.mask_token_id, **kw
    )
    o = DecodeOptions(policy="block", **kw, **duet_options)
    tokens, stats, _ = _native_decode(model.obj, prompt, o)
    return (tokens, stats), (canvas.tolist(), st)


# threshold 1.0: one commit a step (many pruned steps); 0.9 on the LLaDA2 toy's blocks of 16 (the toy commits every
# mask above 0.9 at once: blocks of 8, and the editing toy's, end before a pruned step there)
QUERY_LLADA2 = [
    (toy_name, ratio, block, threshold, edit)
    for toy_name, edit in (("llada2", None), ("llada2_edit", 0.9))
    for ratio in (0.25, 0.5)
    for block, threshold in ((16, 1.0), (8, 1.0), (16, 0.9))
    if threshold == 1.0 or toy_name == "llada2"
]


@pytest.mark.parametrize("toy_name,ratio,block,threshold,edit", QUERY_LLADA2)
def test_native_query_pruning_equals_the_reference_llada2(
    llada2_toy, llada2_edit_toy, toy_name, ratio, block, threshold, edit
):
    """The LLaDA2 toy and its editing toy with ratios that drop rows (selection layer 1, the family's
    default): native tokens, NFE, edits and dropped-row count equal the reference's, and rows were dropped."""
    model, reference = llada2_toy if toy_name == "llada2" else llada2_edit_toy
    c = model.config
    g = torch.Generator().manual_seed(int(ratio * 100) + block)
    q = {"query_keep_ratio": ratio, "query_dense_masks": 2, "query_min_context": 0}
    dropped = 0
    for n in (21, 40):
        prompt = torch.randint(0, min(c.eos_token_id, c.mask_token_id), (n,), generator=g)
        kw = dict(gen_length=32, block_length=block, steps=block, threshold=threshold, edit_threshold=edit)
        (tokens, stats), (canvas, st) = _query_pair(model, reference, prompt, q, **kw)
        assert tokens == canvas, n
        assert stats["nfe"] == st["nfe"] and stats["edits"] == st["edits"]
        assert stats["query_rows_dropped"] == st["query_rows_dropped"]
        dropped += st["query_rows_dropped"]
    assert dropped > 0


@pytest.mark.parametrize("ratio,layer,interval", [(0.25, 1, 4), (0.5, 2, 1), (0.5, 0, 2)])
def test_native_query_pruning_equals_the_reference_sdar(sdar_toy, ratio, layer, interval):
    """The SDAR toy (4 layers: the authors' layer 5 would leave nothing to prune, so the selection layer is
    set): native tokens, NFE and dropped rows equal the reference's."""
    cfg, model, reference = sdar_toy
    dropped = 0
    for prompt in _sdar_prompts(cfg):
        q = {
            "query_keep_ratio": ratio,
            "query_select_layer": layer,
            "query_reuse_interval": interval,
            "query_dense_masks": 1,
            "query_min_context": 0,
        }
        kw = dict(gen_length=24, block_length=8, threshold=1.0)  # one commit a step: later steps exist
        (tokens, stats), (canvas, st) = _query_pair(model, reference, prompt, q, **kw)
        assert tokens == canvas
        assert stats["nfe"] == st["nfe"] and stats["query_rows_dropped"] == st["query_rows_dropped"]
        dropped += st["query_rows_dropped"]
    assert dropped > 0


def test_native_prefix_and_query_sparsity_at_once_equal_the_reference(llada2_toy, llada2_edit_toy):
    """Both parts on: native tokens, NFE, edits, selected keys and dropped rows equal the reference's."""
    both = {
        "prefix_kv_budget": 6,
        "prefix_kv_min_context": 0,
        "query_keep_ratio": 0.5,
        "query_dense_masks": 2,
        "query_min_context": 0,
    }
    for (model, reference), edit in ((llada2_toy, None), (llada2_edit_toy, 0.9)):
        c = model.config
        prompt = torch.arange(3, 43) % c.eos_token_id
        kw = dict(gen_length=32, block_length=16, steps=16, threshold=1.0, edit_threshold=edit)
        (tokens, stats), (canvas, st) = _query_pair(model, reference, prompt, both, **kw)
        assert st["query_rows_dropped"] > 0 and st["prefix_keys_selected"] > 0
        assert tokens == canvas
        for key in ("nfe", "edits", "prefix_keys_selected", "query_rows_dropped"):
            assert stats[key] == st[key], key


def test_native_query_pruning_changes_tokens_as_the_reference_does(llada2_toy):
    """The equalities above are not those of two dense decodes: on some prompt the pruned decode's tokens differ
    from the dense decode's, and the reference's pruned decode differs the same way."""
    model, reference = llada2_toy
    g = torch.Generator().manual_seed(1)
    kw = dict(gen_length=32, block_length=16, steps=16, threshold=1.0)
    q = {"query_keep_ratio": 0.25, "query_min_context": 0}
    changed = 0
    for n in (21, 40, 33, 50):
        prompt = torch.randint(0, 19, (n,), generator=g)
        dense, _, _ = _native_decode(model.obj, prompt, DecodeOptions(policy="block", **kw))
        (tokens, stats), (canvas, st) = _query_pair(model, reference, prompt, q, **kw)
        assert tokens == canvas and stats["query_rows_dropped"] == st["query_rows_dropped"] > 0, n
        changed += tokens != dense
    assert changed > 0


def test_native_query_ratio_one_and_the_gates_are_the_dense_decode(llada2_toy):
    """Ratio 1.0, a prefix below query_min_context, or a dense-masks bound above the block: the dense
    decode's tokens, NFE and keys read, no row dropped."""
    model, _ = llada2_toy
    prompt = [i % 19 for i in range(3, 43)]
    base = DecodeOptions(policy="block", gen_length=32, block_length=16, steps=16, threshold=1.0)
    dense_tokens, dense, _ = _native_decode(model.obj, prompt, base)
    for q in (
        {"query_keep_ratio": 1.0, "query_min_context": 0},
        {"query_keep_ratio": 0.25, "query_min_context": 1 << 20},
        {"query_keep_ratio": 0.25, "query_min_context": 0, "query_dense_masks": 16},
    ):
        tokens, stats, _ = _native_decode(model.obj, prompt, dataclasses.replace(base, **q))
        assert tokens == dense_tokens, q
        assert stats["nfe"] == dense["nfe"] and stats["key_tokens_per_step"] == dense["key_tokens_per_step"], q
        assert stats["query_rows_dropped"] == 0, q
    _, pruned, _ = _native_decode(
        model.obj, prompt, dataclasses.replace(base, query_keep_ratio=0.25, query_min_context=0)
    )
    assert pruned["query_rows_dropped"] > 0


def test_query_pruning_requests_do_not_depend_on_their_batch():
    """Query-pruning requests (alone, with the prefix part, and dense ones) in the scheduler at max_batch 3:
    every request's tokens, NFE and dropped rows equal its decode alone (a pruning forward runs as its
    own group)."""
    import random

    from blockbatch import Engine
    from helpers.batching import same

    engine = Engine.from_pretrained(toy.checkpoint_path("llada2"))
    c = engine.config
    rng = random.Random(56)
    reqs = []
    for i in range(7):
        prompt = [rng.randrange(1, min(c.mask_token_id, c.eos_token_id)) for _ in range(rng.choice([9, 20, 37]))]
        duet_options: dict = {}
        if i % 3 != 2:
            duet_options = dict(query_keep_ratio=rng.choice([0.25, 0.5]), query_dense_masks=2, query_min_context=0)
        if i % 3 == 1:
            duet_options.update(prefix_kv_budget=5, prefix_kv_min_context=0)
        o = DecodeOptions(policy="block", gen_length=32, block_length=16, steps=16, threshold=1.0, **duet_options)
        reqs.append((prompt, o))
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    assert sum(a.stats["query_rows_dropped"] for a in alone) > 0
    got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=3)
    for i, (g, a) in enumerate(zip(got, alone)):
        same(g, a, f"request {i} at max_batch 3")
        assert g.stats["query_rows_dropped"] == a.stats["query_rows_dropped"]
        assert g.stats["prefix_keys_selected"] == a.stats["prefix_keys_selected"]


def test_duet_requests_batch_with_dense_block_requests(tmp_path):
    """DUET requests next to dense block requests in the scheduler (a DUET forward, with its per-layer key
    lists or its query capture, runs as its own group): every request's tokens and counters equal its
    decode alone."""
    import random

    from helpers.batching import same, small_engine

    engine = small_engine(tmp_path / "m", "llada2", seed=5)
    c = engine.config
    rng = random.Random(55)
    reqs = []
    for i in range(8):
        prompt = [rng.randrange(1, min(c.mask_token_id, c.eos_token_id)) for _ in range(rng.choice([9, 20, 37]))]
        duet_options = dict(prefix_kv_budget=rng.choice([3, 6]), prefix_kv_min_context=0) if i % 2 == 0 else {}
        o = DecodeOptions(policy="block", gen_length=32, block_length=8, steps=8, threshold=1.0, **duet_options)
        reqs.append((prompt, o))
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    assert sum(a.stats["prefix_keys_selected"] for a in alone) > 0
    for max_batch in (3, 8):
        got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=max_batch)
        for i, (g, a) in enumerate(zip(got, alone)):
            same(g, a, f"request {i} at max_batch {max_batch}")
            assert g.stats["prefix_keys_selected"] == a.stats["prefix_keys_selected"]
            assert g.stats["key_tokens_per_step"] == a.stats["key_tokens_per_step"]
