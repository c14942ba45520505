"""The ``logprobs`` option (docs/ALGORITHMS.md "Logprobs"), over the registries: for every family x
policy that records them, each generated token's log-probability and top alternatives equal a
recomputation by the float32 reference (the row its reference decoder used when it committed the
token, helpers/logprobs.py), within 1e-4; turning them on changes no token and no forward count; a
request's logprobs do not change with the batch it decodes in. BlockBatch (several canvases per
forward, merges and syncs) is compared with the rows its reference names (``commit_rows``)."""

from __future__ import annotations

import math

import pytest
import torch

from blockbatch import families, policies
from blockbatch.decoding import run_decode, token_logprobs
from blockbatch.policies.blockbatch import llada_reference_result
from blockbatch.reference.dream import decode_with_options
from helpers import families as data
from helpers import logprobs as lp

PAIRS = [(f, p) for f in data.names() for p in families.get(f).POLICIES]
# compared by the rule of helpers/logprobs.py (blockbatch: by its reference's commit rows, below)
RECORDING = ("vanilla", "prefix", "dual", "block", "window", "wavefront")
PROMPTS = ([5], [3, 9, 27, 1, 44, 2, 8, 8, 19])
TOP = 3


def _cases(policy, family):
    cases = data.policy_cases(policy, family)
    if policy == "vanilla" and family == "llada":  # the seeded sampler too
        cases = [*cases, dict(gen_length=16, block_length=8, temperature=0.7, seed=3)]
    return cases


def _plain(entries) -> list:
    """TokenLogprobs comparable with ==, NaN (a position no step committed: a mask left) as None."""
    return [(t.token, None if math.isnan(t.logprob) else t.logprob, t.top) for t in entries]


OK = [(f, p) for f, p in PAIRS if p in RECORDING]


@pytest.mark.parametrize("family,policy", OK, ids=[f"{f}-{p}" for f, p in OK])
def test_logprobs_equal_the_references_commit_rows(engines, family, policy):
    engine, ref = engines(family)
    mask = engine.config.mask_token_id
    shifted = engine.config.shifted_logits
    for prompt in PROMPTS:
        prompt = [t if t != mask else 0 for t in prompt]
        for overrides in _cases(policy, family):
            what = f"{family} {policy} {overrides} prompt {prompt}"
            o = engine.default_options(policy=policy, logprobs=TOP, **overrides)
            g = engine.generate([prompt], o)[0]
            off = engine.generate([prompt], engine.default_options(policy=policy, **overrides))[0]
            assert off.logprobs is None, what
            assert (g.raw_ids, g.stats["nfe"]) == (off.raw_ids, off.stats["nfe"]), what
            rec = lp.Recording(ref)
            row, nfe = policies.reference(rec, torch.tensor(prompt), o, family, engine.checkpoint.proposal_vocab)
            assert row.tolist() == prompt + g.raw_ids and nfe == g.stats["nfe"], what
            # every generated position (the text may end at a first EOS): the decode op's whole table
            table = run_decode(engine.model.obj, torch.tensor(prompt), o).logprobs
            every = token_logprobs(g.raw_ids, table)
            want = lp.expected(rec, len(prompt), g.raw_ids, TOP, shifted)
            assert any(w is not None for w in want), what
            eos = engine.config.eos_token_id
            lp.assert_close(every, want, what, filled_after=g.raw_ids.index(eos) if eos in g.raw_ids else None)
            assert _plain(g.logprobs) == _plain(every[: len(g.ids)]), what  # those of its (trimmed) ids


@pytest.mark.parametrize("family", data.names())
def test_logprobs_do_not_change_with_the_batch(engines, family):
    engine, _ = engines(family)
    policy = next(p for p in families.get(family).POLICIES if p in RECORDING)
    overrides = data.policy_cases(policy, family)[0]
    prompts = [[5], [3, 9, 27, 1, 44, 2, 8, 8, 19], [7, 7, 2], [11, 4]]
    o = engine.default_options(policy=policy, logprobs=2, **overrides)
    alone = [engine.generate([p], o)[0] for p in prompts]
    together = engine.generate(prompts, o, max_batch=4)
    for a, b in zip(alone, together):
        assert a.raw_ids == b.raw_ids and a.stats["nfe"] == b.stats["nfe"]
        assert [(t.token, t.logprob, t.top) for t in a.logprobs] == [(t.token, t.logprob, t.top) for t in b.logprobs]
        assert all(not math.isnan(t.logprob) for t in a.logprobs)


@pytest.mark.parametrize("top", [0, 20])
def test_top_zero_gives_the_token_only_and_twenty_gives_twenty(engines, top):
    engine, _ = engines("llada")
    g = engine.generate([[5, 6]], engine.default_options(policy="dual", gen_length=16, block_length=8, logprobs=top))[0]
    assert g.logprobs and all(len(t.top) == top and t.logprob <= 0 for t in g.logprobs)
    if top:  # the top alternatives are sorted and include the most probable token
        for t in g.logprobs:
            values = [v for _, v in t.top]
            assert values == sorted(values, reverse=True) and t.logprob <= values[0] + 1e-6


# BlockBatch: the registry's cases and ones where merges, syncs and refreshes fire (the test checks
# that they did); on LLaDA divergence refreshes and the seeded sampler too, on Dream an EOS exit.
BRANCH_CASES = {
    "llada": [
        *data.policy_cases("blockbatch", "llada"),
        dict(gen_length=32, block_sizes=(2, 4, 8), threshold=0.6, merge_gate=0.3, refresh_tokens=4, sync_gap=1),
        dict(gen_length=32, block_sizes=(4, 16), threshold=0.95, merge_gate=0.5, refresh_tokens=8, sync_gap=0),
        dict(
            gen_length=32, block_sizes=(2, 4, 8), threshold=0.6, merge_gate=0.3, sync_gap=1, refresh_mode="divergence"
        ),
        dict(
            gen_length=32, block_sizes=(4, 8, 16), threshold=0.8, refresh_tokens=8, sync_gap=4, temperature=0.7, seed=3
        ),
    ],
    "dream": [
        *data.policy_cases("blockbatch", "dream"),
        dict(gen_length=32, block_sizes=(2, 4, 8), threshold=0.6, merge_gate=0.3, refresh_tokens=4, sync_gap=1),
        dict(gen_length=32, block_sizes=(4, 8, 16), threshold=0.8, merge_gate=0.2, refresh_tokens=6, sync_gap=0),
        dict(gen_length=32, block_sizes=(4, 8, 16), threshold=0.6, merge_gate=0.02, prob_floor=0.02, refresh_tokens=0),
    ],
}


def _blockbatch_rows(family, ref, prompt, o, vocab) -> tuple[list[int], int, list]:
    """The reference's (row, nfe, commit rows of the generation) for BlockBatch on ``family``."""
    if family == "llada":
        r = llada_reference_result(ref, torch.tensor(prompt), o, commit_rows=True)
        return r.tokens.tolist(), r.nfe, r.commit_rows
    d = decode_with_options(ref, prompt, o, vocab, commit_rows=True)
    return d.tokens, d.nfe, d.stats["commit_rows"]


@pytest.mark.parametrize("family", sorted(BRANCH_CASES))
def test_blockbatch_logprobs_are_the_winners_commit_rows(engines, family):
    """Per token of the winner: the row its branch committed it from (a merge: the row whose
    probability the merge read; a sync: the leader's record), recomputed by the reference; NaN
    where the EOS exit filled the row after the first EOS."""
    engine, ref = engines(family)
    fired = dict(merged=0, copied=0, nfe_refresh=0)
    # [11, 4] on Dream: merges that read a probability an older forward than the entry's last gave
    # (a slot's record, not the last row's: a per-position record would fail here)
    for prompt in (*PROMPTS, [7, 7, 2], [11, 4]):
        for overrides in BRANCH_CASES[family]:
            what = f"{family} blockbatch {overrides} prompt {prompt}"
            o = engine.default_options(policy="blockbatch", logprobs=TOP, **overrides)
            g = engine.generate([prompt], o)[0]
            off = engine.generate([prompt], engine.default_options(policy="blockbatch", **overrides))[0]
            assert off.logprobs is None, what
            assert (g.raw_ids, g.stats["nfe"]) == (off.raw_ids, off.stats["nfe"]), what
            row, nfe, rows = _blockbatch_rows(family, ref, prompt, o, engine.checkpoint.proposal_vocab)
            assert row == (prompt + g.raw_ids)[: len(row)] and nfe == g.stats["nfe"], what
            every = token_logprobs(g.raw_ids, run_decode(engine.model.obj, torch.tensor(prompt), o).logprobs)
            want = lp.from_rows(rows, g.raw_ids, TOP)
            assert any(w is not None for w in want), what
            lp.assert_close(every, want, what)
            assert _plain(g.logprobs) == _plain(every[: len(g.ids)]), what
            fired["nfe_refresh"] += g.stats["nfe_refresh"]
            for b in g.stats["branches"]:
                fired["merged"] += b["merged"]
                fired["copied"] += b["copied"]
    assert all(n > 0 for n in fired.values()), fired


@pytest.mark.parametrize("family", sorted(BRANCH_CASES))
def test_blockbatch_logprobs_do_not_change_with_the_batch(engines, family):
    engine, _ = engines(family)
    prompts = [[5], [3, 9, 27, 1, 44, 2, 8, 8, 19], [7, 7, 2], [11, 4]]
    o = engine.default_options(policy="blockbatch", logprobs=2, **BRANCH_CASES[family][2])
    alone = [engine.generate([p], o)[0] for p in prompts]
    together = engine.generate(prompts, o, max_batch=4)
    for a, b in zip(alone, together):
        assert a.raw_ids == b.raw_ids and a.stats["nfe"] == b.stats["nfe"]
        assert [(t.token, t.logprob, t.top) for t in a.logprobs] == [(t.token, t.logprob, t.top) for t in b.logprobs]
        assert a.logprobs and all(not math.isnan(t.logprob) for t in a.logprobs)


@pytest.mark.parametrize("family", sorted(BRANCH_CASES))
def test_blockbatch_streams_final_rows(engines, family):
    """A stream's token events carry rows (once every branch holds the same record) equal to the
    result's rows of the same tokens, joined in order; tokens and rows stay aligned."""
    engine, _ = engines(family)
    o = engine.default_options(policy="blockbatch", logprobs=2, **BRANCH_CASES[family][2])
    prompts = [[5], [3, 9, 27, 1, 44, 2, 8, 8, 19], [7, 7, 2]]
    with engine.scheduler(max_batch=2, max_length=128) as sched:
        handles = [sched.submit(torch.tensor(p), o, stream=True) for p in prompts]
        outs = [h.result(timeout=120) for h in handles]
        streamed = 0
        for h, out in zip(handles, outs):
            events = list(h.events(timeout=5))
            tokens, rows = [], []
            for ev in events[:-1]:
                assert ev.kind == "tokens" and ev.logprobs is not None and len(ev.logprobs) == len(ev.tokens)
                tokens += ev.tokens
                rows += ev.logprobs.tolist()
            streamed += len(events) - 1
            n = len(tokens)
            assert tokens == out.tokens[len(out.tokens) - o.gen_length :][:n].tolist()
            assert rows == out.logprobs[:n].tolist()
    assert streamed > len(prompts), "no request streamed more than one chunk"


@pytest.mark.parametrize("bad", [-1, 21])
def test_out_of_range_logprobs_name_the_option(bad):
    from blockbatch import DecodeOptions

    with pytest.raises(ValueError, match="logprobs"):
        DecodeOptions(logprobs=bad)
