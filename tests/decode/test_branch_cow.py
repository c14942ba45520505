"""Copy on write across BlockBatch branches (ALGORITHMS.md 12.3): over a paged pool a row copy
(the init's, a leader sync, a folded twin) is the source row's page-table entries, and a page
is copied only when a row writes into a page another row still names. On the shipped LLaDA and
Dream toys (whose branches agree, so syncs happen) and on peaked random models every decode over
pages of 4 and 16 equals its decode alone over dense rows, token for token and counter for
counter (greedy and sampled; the device coordination of LLaDA with its divergence test reading the
shared pages, and Dream's host coordination), and copies fewer positions than the dense rows'
whole-row copies would."""

from __future__ import annotations

import math

import pytest
import torch

from blockbatch import DecodeOptions
from blockbatch.engine import Engine
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.toy import checkpoint_path, task

from helpers.batching import same

CASES = [
    dict(block_sizes=(4, 8, 16, 32, 64), gen_length=64, sync_gap=4, sync_refresh=True),
    dict(block_sizes=(8, 32), gen_length=64, sync_gap=4, refresh_tokens=8),
    dict(block_sizes=(4, 64), gen_length=64, merge_gate=0.3, refresh_mode="divergence"),
    dict(block_sizes=(4, 16, 64), gen_length=64, temperature=0.9, seed=7, sync_refresh=True),
    dict(block_sizes=(4, 8, 16, 32), gen_length=64, sync_gap=4, fold_rows=False),
]
LLADA_ONLY = {"refresh_mode", "temperature"}  # Dream's BlockBatch: the periodic refresh, greedy


@pytest.fixture(scope="module", params=["llada-toy", "dream-toy", "llada-random", "dream-random"])
def toy(request, tmp_path_factory):
    family, kind = request.param.split("-")
    if kind == "toy":
        engine = Engine.from_pretrained(checkpoint_path(family))
        return engine, [engine.encode(p.prompt, chat=False) for p in task.make_problems(3, 11, "test")]
    # A small vocabulary and a peaked head: branches agree often, and a wrong K/V shows in the tokens.
    folder = tmp_path_factory.mktemp("cow-" + family)
    shape = dict(d_model=64, n_heads=2, n_kv_heads=1, mlp_hidden_size=128, vocab_size=40)
    make_random_checkpoint(folder, seed=1, logit_scale=8.0, family=family, **shape)
    engine = Engine.from_pretrained(folder)
    g = torch.Generator().manual_seed(3)
    return engine, [torch.randint(0, 38, (n,), generator=g) for n in (5, 16, 23)]


def dense_equivalent_pages(stats, canvas: int, page_len: int) -> int:
    """The pages the same row copies would move as whole rows: the init's (every branch but the
    first), each sync a branch received and each folded twin, a row of ceil(canvas / page) each."""
    rows = len(stats["branches"]) - 1 + sum(b["copied"] for b in stats["branches"]) + stats["folded_rows"]
    return rows * math.ceil(canvas / page_len)


@pytest.mark.parametrize("page_len", [4, 16])
def test_paged_branches_equal_dense_rows(toy, page_len):
    engine, prompts = toy
    cases = CASES if engine.config.family == "llada" else [c for c in CASES if not LLADA_ONLY & c.keys()]
    reqs = [(p, DecodeOptions(policy="blockbatch", **case)) for case in cases for p in prompts]
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    with engine.scheduler(max_batch=4, max_length=256, adaptive=False, kv_page_len=page_len) as s:
        outs = [h.result(timeout=600) for h in [s.submit(p, o) for p, o in reqs]]
        k = s.counters()
    assert k["kv_pages_in_use"] == 0, "a finished request kept pages"
    synced = copied = dense = 0
    for i, ((p, o), out, a) in enumerate(zip(reqs, outs, alone)):
        g = engine._generation(p, out)
        same(g, a, f"request {i} pages of {page_len}")
        assert [b["copied"] for b in g.stats["branches"]] == [b["copied"] for b in a.stats["branches"]]
        assert a.stats["kv_pages_copied"] == 0  # dense rows: whole-row copies, no page copied on write
        bound = dense_equivalent_pages(g.stats, len(p) + o.gen_length, page_len)
        assert g.stats["kv_pages_copied"] <= bound, (i, g.stats["kv_pages_copied"], bound)
        synced += sum(b["copied"] for b in g.stats["branches"])
        copied += g.stats["kv_pages_copied"]
        dense += bound
    assert synced > 0, "no leader sync happened: the test shows nothing"
    assert 0 < copied < dense / 2, (copied, dense)
    print(f"pages of {page_len}: {synced} syncs, {copied} pages copied on write, {dense} as whole rows")
