"""share_prompt_kv (ALGORITHMS.md section 12): every BlockBatch branch reads one copy of the
prompt's K/V, the one of the first row each init / refresh feeds. The engine (alone: its own page
store; batched: a scheduler's paged pool, at several page lengths) equals the float32 reference
with the same option token for token and counter for counter, on LLaDA and Dream, random models
and the shipped toys, whatever the page length; a request holds the prompt's complete pages once
(Dream: those before its last prompt position, which its block steps write); a dense pool refuses
the option naming kv_page_len."""

from __future__ import annotations

import random

import pytest
import torch

from blockbatch import DecodeOptions, Engine, toy
from blockbatch.decoding import run_decode
from blockbatch.native import NativeModel
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.reference.blockbatch import blockbatch_generate
from blockbatch.reference.dream import dream_blockbatch
from blockbatch.reference.model import ReferenceModel
from blockbatch.loading import load_checkpoint
from blockbatch.scheduler import check_pool

from helpers.batching import same, small_engine

# Prompts shorter than a page, a whole number of pages (16, 32) and with a partial last page.
PROMPT_LENGTHS = (5, 16, 21, 37)
CASES = [
    dict(block_sizes=(4, 8, 16, 32), gen_length=64, sync_gap=4, sync_refresh=True),
    dict(block_sizes=(8, 32), gen_length=64, sync_gap=4, refresh_tokens=8),
    dict(block_sizes=(4, 64), gen_length=64, merge_gate=0.3, refresh_mode="divergence"),
]


@pytest.fixture(scope="module")
def llada():
    config = random_config(d_model=64, n_heads=2, n_kv_heads=1, mlp_hidden_size=128, vocab_size=40)
    weights = random_weights(config, seed=1, logit_scale=8.0)
    return config, ReferenceModel(config, weights), NativeModel(config, weights)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c["block_sizes"])))
def test_llada_alone_equals_reference(llada, case):
    from test_blockbatch import assert_same

    config, ref, nat = llada
    differs = 0
    for lp in PROMPT_LENGTHS:
        prompt = torch.randint(0, config.vocab_size - 2, (lp,), generator=torch.Generator().manual_seed(lp))
        kw = dict(case)
        G = kw.pop("gen_length")
        expected = blockbatch_generate(ref, prompt, G, share_prompt_kv=True, stop_on_eos=True, **kw)
        out = run_decode(nat.obj, prompt, DecodeOptions(policy="blockbatch", gen_length=G, share_prompt_kv=True, **kw))
        assert_same(expected, out)
        exact = blockbatch_generate(ref, prompt, G, stop_on_eos=True, **kw)
        differs += not torch.equal(exact.tokens, expected.tokens) or exact.nfe != expected.nfe
    print(f"share_prompt_kv changed {differs} of {len(PROMPT_LENGTHS)} decodes of {case}")


@pytest.fixture(scope="module")
def dream(tmp_path_factory):
    folder = tmp_path_factory.mktemp("share-dream")
    engine = small_engine(folder, "dream", seed=3)
    return engine, ReferenceModel.from_checkpoint(load_checkpoint(folder))


@pytest.mark.parametrize("lp", PROMPT_LENGTHS)
def test_dream_alone_equals_reference(dream, lp):
    engine, ref = dream
    prompt = [1 + (7 * i) % 50 for i in range(lp)]
    for sizes, refresh, sync_refresh in (((4, 8, 16), 8, True), ((8, 16), 4, False)):
        o = DecodeOptions(
            policy="blockbatch",
            gen_length=48,
            block_sizes=sizes,
            refresh_tokens=refresh,
            sync_refresh=sync_refresh,
            share_prompt_kv=True,
        )
        g = engine.generate([prompt], o)[0]
        r = dream_blockbatch(
            ref, prompt, 48, sizes, refresh_tokens=refresh, sync_refresh=sync_refresh, share_prompt_kv=True
        )
        row = list(prompt) + list(g.raw_ids)
        assert row[: len(r.tokens)] == r.tokens, (lp, sizes)
        assert g.stats["nfe"] == r.nfe, (lp, sizes)
        for k in ("nfe_init", "nfe_block", "nfe_refresh", "winner_block_size", "folded_rows"):
            assert g.stats[k] == r.stats[k], (lp, sizes, k)


@pytest.fixture(scope="module", params=["llada", "dream"])
def engine(request, tmp_path_factory):
    return small_engine(tmp_path_factory.mktemp("share-" + request.param), request.param, seed=8)


@pytest.mark.parametrize("page_len", [4, 16, 48])
def test_batched_over_pages_equals_alone(engine, page_len):
    """Requests with and without share_prompt_kv, prompts of several lengths, decoded together over
    a pool of pages of 4, 16 or 48 positions: each equals its decode alone (which pages its own
    rows in pages of 16): the sharing does not depend on the page length."""
    reqs = []
    for i, lp in enumerate((3, 16, 21, 40, 50)):
        prompt = [1 + (5 * j + i) % 40 for j in range(lp)]
        o = DecodeOptions(
            policy="blockbatch", gen_length=32, block_sizes=((4, 8, 16), (8, 32))[i % 2], share_prompt_kv=i != 4
        )
        reqs.append((prompt, o))
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    with engine.scheduler(max_batch=3, max_length=128, adaptive=False, kv_page_len=page_len) as s:
        outs = [h.result(timeout=300) for h in [s.submit(torch.tensor(p), o) for p, o in reqs]]
        assert s.counters()["kv_pages_in_use"] == 0
    for i, ((p, o), out, a) in enumerate(zip(reqs, outs, alone)):
        same(engine._generation(torch.tensor(p), out), a, f"request {i} pages of {page_len}")


def test_the_prompt_pages_are_held_once(engine):
    """3 branches, a 40-token prompt, 32 generated (72 positions, 5 pages of 16 a row): the 2 complete
    prompt pages once + 3 x 3 own pages = 11 pages, against 3 x 5 = 15 without sharing."""
    o = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8, 16))
    prompt = torch.tensor([1 + j % 30 for j in range(40)])
    for share, held in ((True, 11), (False, 15)):
        s = torch.classes.blockbatch.Scheduler(engine.model.obj, 2, 128, 0, [], [], 0.0, 16, False)
        s.add(prompt, o.replace(share_prompt_kv=share).native, False)
        s.step(0.0)
        assert dict(s.counters())["kv_pages_in_use"] == held, share
        s.close()


def test_a_prompt_page_a_block_step_writes_is_not_shared(engine):
    """A 32-token prompt, 32 generated (4 pages of 16 a row), 3 branches. LLaDA: both prompt pages
    are shared, 2 + 3 x 2 = 8 pages. Dream's first window feeds the last prompt position (its
    logit shift), so that position's page is each row's own: 1 + 3 x 3 = 10."""
    o = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8, 16), share_prompt_kv=True)
    prompt = torch.tensor([1 + j % 30 for j in range(32)])
    held = {"llada": 8, "dream": 10}[engine.config.family]
    s = torch.classes.blockbatch.Scheduler(engine.model.obj, 2, 128, 0, [], [], 0.0, 16, False)
    s.add(prompt, o.native, False)
    s.step(0.0)
    assert dict(s.counters())["kv_pages_in_use"] == held
    s.close()


def test_a_dense_pool_refuses_it_by_name(engine):
    o = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8), share_prompt_kv=True)
    with engine.scheduler(max_batch=1, max_length=64, adaptive=False, kv_page_len=0) as s:
        with pytest.raises(ValueError, match=r"share_prompt_kv needs a paged KV pool.*kv_page_len > 0"):
            s.submit(torch.tensor([1, 2, 3]), o)
    assert check_pool(engine.model.obj, 1, 64, 0, 16)["kv_pool_rows"] >= 1


# The shipped toys, trained and confident where the random models above are not: on them the
# page length once decided Dream's tokens. Dream's block step feeds its window from position
# start - 1 (its logit shift), so its first window writes the last prompt position into its own row;
# a prompt of whole pages (any prompt at pages of 1, 16 tokens at pages of 16) had put that
# position on a page every row shared, where a block step's write is dropped (or, from the row
# that fed the refresh first, lands in every row). Page lengths: 1, shorter than the prompts,
# dividing some of them, the default and longer than every canvas.
TOY_PAGE_LENGTHS = (1, 3, 4, 7, 16, 64, 256)
# (prompt length, seed): shorter than most pages, whole pages of 1, 4 and 16, partial pages; the
# seeds are prompts on which the old rule changed Dream's tokens at some page length.
TOY_PROMPTS = ((5, 3), (16, 1), (16, 8), (73, 15))
TOY_OPTIONS = DecodeOptions(policy="blockbatch", gen_length=64, share_prompt_kv=True)


def toy_prompt(length: int, seed: int) -> list[int]:
    """A prompt of the toys' character ids (neither EOS nor mask), drawn with `seed`."""
    rng = random.Random(seed)
    return [rng.randrange(1, 19) for _ in range(length)]


def reference_row(ref, family: str, prompt: list[int], o: DecodeOptions, vocab_limit: int):
    """The float32 reference with o's options resolved for `family`: the full row the engine returns
    (a Dream row cut after an EOS exit continues with EOS) and the result's counters."""
    r = blockbatch_generate(
        ref,
        torch.tensor(prompt),
        o.gen_length,
        o.resolved("block_sizes", family),
        threshold=o.resolved("threshold", family),
        merge_gate=o.resolved("merge_gate", family),
        sync_gap=o.resolved("sync_gap", family),
        refresh_tokens=o.resolved("refresh_tokens", family),
        refresh_mode=o.resolved("refresh_mode", family),
        prob_floor=o.resolved("prob_floor", family),
        stop_on_eos=o.resolved("stop_on_eos", family),
        sync_refresh=o.sync_refresh,
        fold_rows=o.fold_rows,
        share_prompt_kv=o.share_prompt_kv,
        family=family,
        vocab_limit=vocab_limit if family == "dream" else None,
    )
    if family == "dream" and r.early_exit:
        eos, lp = ref.config.eos_token_id, len(prompt)
        row = r.tokens.tolist()
        cut = lp + row[lp:].index(eos) + 1
        r.tokens = torch.tensor(row[:cut] + [eos] * (len(row) - cut))
    return r


@pytest.fixture(scope="module", params=["llada", "dream"])
def toy_model(request):
    path = toy.checkpoint_path(request.param)
    engine = Engine.from_pretrained(path)
    expected = {}
    ref = ReferenceModel.from_checkpoint(load_checkpoint(path))
    for lp, seed in TOY_PROMPTS:
        prompt = toy_prompt(lp, seed)
        expected[lp, seed] = reference_row(ref, request.param, prompt, TOY_OPTIONS, engine.checkpoint.proposal_vocab)
    return request.param, engine, expected


def test_shared_prompt_decode_does_not_depend_on_the_page_length(toy_model):
    """Each prompt alone (pages of 16 of its own) and all of them batched through a pool of pages of
    1, 3, 4, 7, 16, 64 and 256 positions: every decode equals the reference, tokens and counters."""
    from test_blockbatch import assert_same

    family, engine, expected = toy_model

    def check(key, out, where):
        try:
            assert_same(expected[key], out)
        except AssertionError as e:
            raise AssertionError(f"{family}, prompt (length, seed) {key}, {where}: {e}") from e

    prompts = {key: torch.tensor(toy_prompt(*key)) for key in TOY_PROMPTS}
    for key, prompt in prompts.items():
        check(key, run_decode(engine.model.obj, prompt, TOY_OPTIONS), "alone")
    for page_len in TOY_PAGE_LENGTHS:
        with engine.scheduler(max_batch=4, max_length=256, adaptive=False, kv_page_len=page_len) as s:
            handles = {key: s.submit(prompt, TOY_OPTIONS) for key, prompt in prompts.items()}
            outs = {key: h.result(timeout=300) for key, h in handles.items()}
            assert s.counters()["kv_pages_in_use"] == 0
        for key, out in outs.items():
            check(key, out, f"batched over pages of {page_len}")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("model", ["toy", "random"])
def test_shared_prompt_decode_does_not_depend_on_the_page_length_grid(family, model, tmp_path):
    """The heavier grid: 12 prompts of 1 to 128 tokens (around whole pages of 16, 32 and 64) with
    varied branch sets, refresh clocks, sync_refresh and fold_rows, on the toy or a random model,
    alone and batched three at a time over pages of 1, 2, 3, 5, 8, 16, 32, 64, 128 and 256: every
    decode equals the reference."""
    from test_blockbatch import assert_same

    if model == "toy":
        engine = Engine.from_pretrained(toy.checkpoint_path(family))
    else:
        engine = small_engine(tmp_path, family, seed=11)
    ref = ReferenceModel.from_checkpoint(engine.checkpoint)
    rng = random.Random(7)
    avoid = {engine.config.mask_token_id, engine.config.eos_token_id}
    cases = []
    for lp in (1, 2, 7, 15, 16, 17, 31, 32, 33, 64, 73, 128):
        prompt = [t if t not in avoid else 1 for t in (rng.randrange(1, engine.config.vocab_size) for _ in range(lp))]
        G = rng.choice([32, 64])
        o = DecodeOptions(
            policy="blockbatch",
            gen_length=G,
            block_sizes=rng.choice([None, (4, 8, 16), (8, 32), (4, 32)]),
            refresh_tokens=rng.choice([4, 8, 32]),
            sync_refresh=rng.choice([False, True]),
            fold_rows=rng.choice([False, True]),
            share_prompt_kv=True,
        )
        cases.append((torch.tensor(prompt), o, reference_row(ref, family, prompt, o, engine.checkpoint.proposal_vocab)))

    def check(case, out, where):
        prompt, o, want = case
        try:
            assert_same(want, out)
        except AssertionError as e:
            raise AssertionError(f"{model} {family}, prompt of {prompt.numel()} tokens, {o}, {where}: {e}") from e

    for case in cases:
        check(case, run_decode(engine.model.obj, case[0], case[1]), "alone")
    for page_len in (1, 2, 3, 5, 8, 16, 32, 64, 128, 256):
        with engine.scheduler(max_batch=3, max_length=256, adaptive=False, kv_page_len=page_len) as s:
            outs = [h.result(timeout=300) for h in [s.submit(p, o) for p, o, _ in cases]]
        for case, out in zip(cases, outs):
            check(case, out, f"batched over pages of {page_len}")
