"""The prefix cache (ALGORITHMS.md 12.6; decode/batch/prefix_cache.h): block-causal requests (LLaDA2,
policy block) read the K/V of their prompts' complete blocks from earlier requests with the same
blocks. Each request's tokens, NFE and edits equal its decode without the cache (float32, CPU),
sequential and batched, under a budget small enough to evict; the hits are counted per request
and by the scheduler; a block length that is not whole pages is decoded without the cache."""

from __future__ import annotations

import pytest
import torch

from blockbatch import DecodeOptions
from blockbatch.scheduler import EventRecord

from helpers.batching import small_engine

SAME = ("nfe", "nfe_block", "edits", "winner_block_size", "committed_per_step")


@pytest.fixture(scope="module", params=["llada2", "sdar"])
def engine(request, tmp_path_factory):
    return small_engine(tmp_path_factory.mktemp("prefix-" + request.param), request.param, seed=5)


def _requests(vocab: int, mask: int, n: int, common: int, block: int, editing: bool):
    """n prompts: the same `common` tokens, then 0..2 blocks and a tail of their own."""
    g = torch.Generator().manual_seed(common + block)
    shared = [t if t != mask else 1 for t in torch.randint(2, vocab - 2, (common,), generator=g).tolist()]
    out = []
    for i in range(n):
        own = torch.randint(2, vocab - 2, (int(torch.randint(1, 2 * block + 5, (1,), generator=g)),), generator=g)
        prompt = shared + [t if t != mask else 1 for t in own.tolist()]
        o = DecodeOptions(
            policy="block",
            gen_length=24,
            block_length=block,
            threshold=0.9,
            edit_threshold=0.5 if editing and i % 2 else None,
        )
        out.append((prompt, o))
    return out


def _same(a, b, what):
    assert a.raw_ids == b.raw_ids, f"{what}: tokens differ"
    for k in SAME:
        assert a.stats[k] == b.stats[k], f"{what}: {k} {a.stats[k]} != {b.stats[k]}"


@pytest.mark.parametrize("block,max_batch", [(16, 1), (16, 3), (32, 2)])
def test_cached_requests_equal_their_decode_alone(engine, block, max_batch):
    c = engine.config
    # LLaDA2: every other request edits; SDAR: every other one unmasks statically (it has no editing)
    reqs = _requests(c.vocab_size, c.mask_token_id, 8, 3 * block + 5, block, editing=c.family == "llada2")
    if c.family == "sdar":
        reqs = [(p, o.replace(unmasking="static") if i % 2 else o) for i, (p, o) in enumerate(reqs)]
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    cached = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=max_batch, prefix_cache=True)
    hits = [g.stats["prefix_cache_hit_tokens"] for g in cached]
    for i, (g, a) in enumerate(zip(cached, alone)):
        _same(g, a, f"request {i}")
        assert a.stats["prefix_cache_hit_tokens"] == 0
        assert hits[i] % block == 0 and hits[i] <= len(reqs[i][0]) // block * block
    # The first max_batch requests start together with nothing cached; every later one reads the
    # common complete blocks (3) at least, and computes fewer query tokens.
    assert hits[:max_batch] == [0] * max_batch
    assert all(h >= 3 * block for h in hits[max_batch:]), hits
    for g, a, h in zip(cached, alone, hits):
        assert sum(g.stats["query_tokens_per_step"]) == sum(a.stats["query_tokens_per_step"]) - h


def test_a_small_budget_evicts_and_stays_exact(engine):
    """A pool of 16 pages of 16 (a request takes up to 8; each prefix leaves 4-6 cached blocks of one
    page): cached blocks are evicted, least recently used first, when a request needs pages; the
    results stay exact."""
    c = engine.config
    block = 16
    reqs = []
    for k in range(4):  # four prefixes, two requests each, in the order a, b, c, d, a, b, c, d
        reqs += _requests(c.vocab_size, c.mask_token_id, 1, 4 * block + k, block, editing=False)
    reqs = reqs + reqs
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    page_bytes = c.n_layers * 2 * c.n_kv_heads * 16 * c.head_dim * 4
    with engine.scheduler(
        max_batch=1, max_length=128, kv_budget_bytes=16 * page_bytes, adaptive=False, kv_page_len=16, prefix_cache=True
    ) as s:
        outs = [s.submit(torch.tensor(p), o).result(timeout=120) for p, o in reqs]
        k = s.counters()
    assert k["kv_pages"] == 16
    assert k["prefix_cache_evictions"] > 0 and k["prefix_cache_pages"] <= 16, k
    assert k["prefix_cache_hit_tokens"] == sum(o.stats["prefix_cache_hit_tokens"] for o in outs)
    assert k["kv_pages_in_use"] == 0
    for i, (out, a) in enumerate(zip(outs, alone)):
        _same(engine._generation(torch.tensor(reqs[i][0]), out), a, f"request {i}")


def test_blocks_that_are_not_whole_pages_are_not_cached(engine):
    c = engine.config
    reqs = _requests(c.vocab_size, c.mask_token_id, 3, 40, 8, editing=False)  # blocks of 8, pages of 16
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    cached = engine.generate([p for p, _ in reqs], [o for _, o in reqs], prefix_cache=True)
    for i, (g, a) in enumerate(zip(cached, alone)):
        _same(g, a, f"request {i}")
        assert g.stats["prefix_cache_hit_tokens"] == 0


def test_other_families_ignore_it(tmp_path):
    e = small_engine(tmp_path, "llada", seed=1)
    prompts = [[5, 6, 7, 8] * 10, [5, 6, 7, 8] * 10 + [9]]
    o = DecodeOptions(policy="dual", gen_length=16, block_length=8)
    for g, a in zip(e.generate(prompts, o, prefix_cache=True), [e.generate([p], o)[0] for p in prompts]):
        assert g.raw_ids == a.raw_ids and g.stats["prefix_cache_hit_tokens"] == 0


def test_prefix_cache_argument_is_checked(engine):
    with pytest.raises(TypeError, match="prefix_cache must be True or False"):
        engine.generate(["1+1"], prefix_cache="yes")
    with pytest.raises(TypeError, match="prefix_cache must be True or False"):
        engine.scheduler(max_batch=1, max_length=64, adaptive=False, prefix_cache=1)


def test_a_running_request_shares_its_blocks_after_its_first_forward(engine):
    """A request publishes its complete prompt blocks once its first forward has written them, so a
    request admitted while it still decodes reads them (not only after it finishes)."""
    c = engine.config
    (p1, o), (p2, _) = _requests(c.vocab_size, c.mask_token_id, 2, 4 * 16, 16, editing=False)
    o = o.replace(gen_length=64, threshold=0.999)  # many steps: still running when the second comes
    s = torch.classes.blockbatch.Scheduler(engine.model.obj, 2, 256, 0, [], [], 0.0, 16, True)
    s.add(torch.tensor(p1), o.native, False)
    s.step(0.0)  # admitted, first forward run: its 4 common blocks are cached
    k = dict(s.counters())
    assert k["running"] == 1 and k["prefix_cache_blocks"] >= 4, k
    s.add(torch.tensor(p2), o.native, False)
    finished = {}
    while len(finished) < 2:
        s.step(0.0)
        for e in map(EventRecord._make, s.events()):
            if e.kind == "finished":
                finished[e.id] = True
    assert dict(s.counters())["prefix_cache_hit_tokens"] >= 4 * 16
    s.close()
    alone = [engine.generate([p], o)[0] for p in (p1, p2)]
    both = engine.generate([p1, p2], o, max_batch=2, prefix_cache=True)
    for g, a in zip(both, alone):
        _same(g, a, "batched")


def test_a_cancelled_request_leaves_only_blocks_it_wrote(engine):
    """A request cancelled before it starts caches nothing; one cancelled after its first forward
    leaves the blocks it wrote, and a later request reads them and still equals its decode alone
    (the cache holds the pages, not the request)."""
    c = engine.config
    (p1, o), (p2, _) = _requests(c.vocab_size, c.mask_token_id, 2, 4 * 16, 16, editing=False)
    o = o.replace(gen_length=64, threshold=0.999)
    s = torch.classes.blockbatch.Scheduler(engine.model.obj, 1, 256, 0, [], [], 0.0, 16, True)
    try:
        first = s.add(torch.tensor(p1), o.native, False)
        assert s.cancel(first)
        s.step(0.0)
        # cancelled (drained: step waits while events are pending)
        assert [(e.id, e.kind, e.error_kind) for e in map(EventRecord._make, s.events())] == [
            (first, "cancelled", "cancelled")
        ]
        k = dict(s.counters())
        assert k["running"] == 0 and k["prefix_cache_blocks"] == 0, k
        second = s.add(torch.tensor(p1), o.native, False)
        s.step(0.0)  # admitted, first forward run: its blocks are cached
        assert dict(s.counters())["prefix_cache_blocks"] >= 4
        assert s.cancel(second)
        kinds = {}
        while second not in kinds:
            s.step(0.0)
            kinds.update((e.id, e.kind) for e in map(EventRecord._make, s.events()))
        assert kinds[second] == "cancelled", kinds
        k = dict(s.counters())
        assert k["running"] == 0 and k["prefix_cache_blocks"] >= 4, k
        third = s.add(torch.tensor(p2), o.native, False)
        tokens = None
        while tokens is None:
            s.step(0.0)
            for e in map(EventRecord._make, s.events()):
                assert e.kind in ("tokens", "finished"), e.error
                if e.id == third and e.kind == "finished":
                    tokens = e.tokens
        assert dict(s.counters())["prefix_cache_hit_tokens"] >= 4 * 16
    finally:
        s.close()
    alone = engine.generate([p2], o)[0]
    assert tokens[len(p2) :].tolist() == alone.raw_ids  # it read blocks a cancelled request wrote


@pytest.mark.parametrize("max_batch", [1, 2, 4])
def test_generate_keeps_shared_blocks_with_the_default_budget(engine, max_batch):
    """Class: the prefix cache keeps what it promises. ``Engine.generate(..., prefix_cache=True)``
    with the default budget once sized its pool to the running requests alone, so every admission
    evicted the blocks cached before it: 0 hits on 12 requests repeating 4 prompts. Its pool now
    also holds the blocks two or more of its prompts share: every repeat admitted after its first
    copy's first forward reads all its complete blocks, and decodes as alone."""
    c = engine.config
    g = torch.Generator().manual_seed(max_batch)
    prompts = [
        [
            t if t != c.mask_token_id else 1
            for t in torch.randint(2, c.vocab_size - 2, (40 + 7 * k,), generator=g).tolist()
        ]
        for k in range(4)
    ]
    reqs = prompts * 3  # a, b, c, d, a, b, c, d, a, b, c, d
    o = DecodeOptions(policy="block", gen_length=24, block_length=16, threshold=0.9)
    alone = {i: engine.generate([p], o)[0] for i, p in enumerate(prompts)}
    out = engine.generate(reqs, o, max_batch=max_batch, prefix_cache=True)
    hits = [r.stats["prefix_cache_hit_tokens"] for r in out]
    for i, r in enumerate(out):
        _same(r, alone[i % 4], f"request {i}")
    # The first copies compute their blocks; every later copy starts after them (max_batch <= 4)
    # and reads all its complete blocks.
    assert hits[:4] == [0] * 4, hits
    assert hits[4:] == [len(reqs[i]) // 16 * 16 for i in range(4, 12)], hits
