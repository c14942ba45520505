"""The scheduler's paged KV pool (decode/batch/kv_pool.h, ALGORITHMS.md section 12): requests
decoded over pages give the tokens and every counter of their decode alone (float32, CPU), for
every policy and family, at any page length; a request holds the pages its own canvas needs, not
rows of max_length, so a budget that holds too few dense rows holds the request as pages; the
pages come back when it ends; the layout argument is checked by name."""

from __future__ import annotations

import random

import pytest
import torch

from blockbatch import DecodeOptions
from blockbatch.scheduler import check_pool

from helpers.batching import mixed_requests, same, small_engine


@pytest.fixture(scope="module", params=["llada", "dream", "llada2", "sdar"])
def engine(request, tmp_path_factory):
    return small_engine(tmp_path_factory.mktemp("paged-" + request.param), request.param, seed=6)


@pytest.fixture(scope="module")
def requests_and_alone(engine):
    c = engine.config
    reqs = mixed_requests(random.Random(5), c.vocab_size, c.mask_token_id, 10, c.family)
    return reqs, [engine.generate([p], o)[0] for p, o in reqs]


@pytest.mark.parametrize("page_len", [0, 1, 16, 48])
def test_paged_requests_equal_their_decode_alone(engine, requests_and_alone, page_len):
    """Dense rows (0) and pages of 1, 16 and 48 positions (a canvas is rarely a whole number of
    them): every request's tokens and counters equal its decode alone, with all of them sharing
    the pool and requests joining as others leave (max_batch 4 of 10)."""
    reqs, alone = requests_and_alone
    with engine.scheduler(max_batch=4, max_length=128, adaptive=False, kv_page_len=page_len) as sched:
        handles = [sched.submit(torch.tensor(p), o) for p, o in reqs]
        outs = [h.result(timeout=300) for h in handles]
        k = sched.counters()
    assert k["kv_paged"] == (page_len > 0) and k["kv_page_len"] == (page_len or 128)
    assert k["kv_pages_in_use"] == 0 and k["kv_rows_in_use"] == 0, "a finished request kept pages"
    for i, ((prompt, o), out, a) in enumerate(zip(reqs, outs, alone)):
        same(engine._generation(torch.tensor(prompt), out), a, f"request {i} ({o.policy}) pages of {page_len}")


def _native(engine, max_batch, max_length, budget, page_len):
    return torch.classes.blockbatch.Scheduler(
        engine.model.obj, max_batch, max_length, budget, [], [], 0.0, page_len, False
    )


def test_a_request_holds_the_pages_of_its_canvas(engine):
    """A BlockBatch request of 3 branches with a canvas of 20 + 32 positions in a pool of rows of
    256 positions holds 3 x ceil(52 / 16) = 12 pages of 16 while it runs (dense: 3 rows of 256),
    and none after."""
    c = engine.config
    o = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8, 16))
    block_causal = c.family in ("llada2", "sdar")
    if block_causal:
        o = DecodeOptions(policy="block", gen_length=32, block_length=16)
    prompt = torch.tensor([1 + i % 5 for i in range(20)])
    for page_len, held in ((16, 4 if block_causal else 12), (0, 1 if block_causal else 3)):
        s = _native(engine, 2, 256, 0, page_len)
        s.add(prompt, o.native, False)
        s.step(0.0)  # admits it and runs its first forward
        k = dict(s.counters())
        assert k["kv_pages_in_use"] == held, (page_len, k)
        while not any(kind == 1 for kind in s.events()[1]):
            s.step(0.0)
        assert dict(s.counters())["kv_pages_in_use"] == 0
        s.close()


def test_a_budget_of_too_few_rows_holds_the_request_as_pages(engine):
    """kv_budget_bytes for 2 rows of max_length 512: a 3-branch request is refused by dense rows
    (it needs 3) but fits as pages (3 x 3 of the 64 pages the budget buys), and decodes as alone."""
    c = engine.config
    if c.family in ("llada2", "sdar"):
        pytest.skip("LLaDA2 decodes with one KV row (policy block)")
    o = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8, 16))
    prompt = torch.tensor([1, 2, 3, 4])
    row_512 = check_pool(engine.model.obj, 1, 512, 0, 0)["kv_row_bytes"]
    with engine.scheduler(max_batch=2, max_length=512, kv_budget_bytes=2 * row_512, adaptive=False, kv_page_len=0) as s:
        with pytest.raises(ValueError, match=r"needs 3 KV rows of 36 positions \(3 rows of 512 positions\)"):
            s.submit(prompt, o)
    with engine.scheduler(
        max_batch=2, max_length=512, kv_budget_bytes=2 * row_512, adaptive=False, kv_page_len=16
    ) as s:
        assert s.counters()["kv_pages"] == 64
        out = s.submit(prompt, o).result(timeout=120)
    same(engine._generation(prompt, out), engine.generate([prompt], o)[0], "paged under a 2-row budget")


def test_check_pool_and_counters_agree_paged(engine):
    for page_len in (0, 16, 7):
        report = check_pool(engine.model.obj, 4, 100, 0, page_len)
        with engine.scheduler(max_batch=4, max_length=100, adaptive=False, kv_page_len=page_len) as s:
            k = s.counters()
        assert (report["kv_pool_rows"], report["kv_row_bytes"]) == (k["kv_pool_rows"], k["kv_row_bytes"])
        per_row = -(-100 // page_len) if page_len else 1
        assert k["kv_pages"] == k["kv_pool_rows"] * per_row


@pytest.mark.parametrize("value,error", [(-2, ValueError), (2.5, TypeError), (10_000, ValueError)])
def test_kv_page_len_is_checked_by_name(engine, value, error):
    with pytest.raises(error, match="kv_page_len"):
        engine.scheduler(max_batch=1, max_length=64, adaptive=False, kv_page_len=value)
    with pytest.raises(error, match="kv_page_len"):
        check_pool(engine.model.obj, 1, 64, 0, value)
