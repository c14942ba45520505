"""Policy ``window`` (Window-Diffusion, ALGORITHMS.md 13) on LLaDA against the authors' own decoder.

The fixture holds what the authors' LLaDA ``generate`` (vhicrgit/Window-Diffusion,
``llada/model/modeling_llada.py``; its forwards on our float32 reference model) returned on the
shipped LLaDA toy for held-out toy prompts at eight settings (the authors' window 64 / active 16 /
refresh 32 at one token per step, and smaller windows, two tokens per step, mixed counts, an empty
mask window, a full forward every step; two with their Gumbel sampling, seeded).
``tests/tools/record_authors_window.py`` recorded it (the authors' code is not a dependency).
Per prompt: the generated tokens, the forwards (full and pruned), the keys the pruned forwards
attended and the query tokens of all forwards.

The engine runs every prompt; the Python reference (``blockbatch.reference.window``) every
``REFERENCE_EVERY``-th. Ties decide tokens: the toy's float32 confidences are often exactly 1.0, and
a selection that breaks them at the lowest position instead of by torch.topk's order (the authors')
changes answers, which ``test_ties_decide_tokens`` shows on the fixture itself.
"""

from __future__ import annotations


import pytest
import torch

from blockbatch import DecodeOptions, RequestError
from blockbatch.decoding import run_decode
from blockbatch.engine import Engine
from blockbatch.reference import window as ref_window
from blockbatch.reference.model import ReferenceModel
from helpers.packing import fixture_runs as runs
from helpers.packing import assert_matches_recording, load_fixture, mismatches, pack, unpack

REFERENCE_EVERY = 10


@pytest.fixture(scope="module")
def recorded():
    return load_fixture("authors_window_llada.json")


@pytest.fixture(scope="module")
def toy():
    engine = Engine.from_pretrained()
    return engine, ReferenceModel.from_checkpoint(engine.checkpoint)


SETTINGS = [
    "gen64_steps64_w64_a16_r32",
    "gen64_steps64_w16_a4_r8",
    "gen64_steps32_w8_a2_r4",
    "gen64_steps48_w0_a3_r5",
    "gen64_steps64_w32_a8_r1",
    "gen32_steps32_w4_a1_r16",
    "gen64_steps64_w16_a4_r8_t3.0_s3",  # their Gumbel sampling, seeded (the toy is so sure of
    "gen64_steps32_w8_a2_r4_t3.0_s5",  # itself that temperature 1 samples its argmax)
]


def options_of(s: dict) -> DecodeOptions:
    return DecodeOptions(policy="window", **s)


def test_fixture_covers_the_settings(recorded):
    assert sorted(recorded["settings"]) == sorted(SETTINGS)
    for key in SETTINGS:
        rs = runs(recorded, key)
        assert len(rs) == len(recorded["prompts"]) >= 60
        s = recorded["settings"][key]
        for r in rs:
            assert r["nfe"] == s["steps"]  # one forward per step
            assert r["nfe_full"] == -(-s["steps"] // s["refresh_interval"])
        if s["temperature"] > 0:  # sampling changes answers: the draws are matched, not only ties
            greedy = runs(recorded, key.rsplit("_t", 1)[0])
            assert any(a["tokens"] != b["tokens"] for a, b in zip(rs, greedy))


@pytest.mark.parametrize("key", SETTINGS)
def test_engine_matches_authors(recorded, toy, key):
    engine, _ = toy
    options = options_of(recorded["settings"][key])

    def decode(ids):
        out = run_decode(engine.model.obj, ids, options)
        s = out.stats
        return dict(
            tokens=pack(out.tokens[len(ids) :]),
            nfe=s["nfe"],
            nfe_full=s["nfe_full"],
            nfe_pruned=s["nfe_pruned"],
            pruned_key_tokens=s["pruned_key_tokens"],
            query_tokens=sum(s["query_tokens_per_step"]),
        )

    here = _reference_decode(toy[1], recorded["settings"][key])
    assert_matches_recording(recorded, key, decode, here=here)


def _reference_decode(ref, s):
    def decode(ids):
        r = ref_window.window_generate(
            ref,
            ids,
            s["gen_length"],
            s["steps"],
            s["window_tokens"],
            s["active_tokens"],
            s["refresh_interval"],
            ref.config.mask_token_id,
            temperature=s["temperature"],
            seed=s["seed"],
        )
        return dict(
            tokens=pack(r.tokens[len(ids) :]),
            nfe=r.nfe,
            nfe_full=r.nfe_full,
            nfe_pruned=r.nfe_pruned,
            pruned_key_tokens=r.pruned_key_tokens,
            query_tokens=sum(r.query_tokens_per_step),
        )

    return decode


@pytest.mark.parametrize("key", SETTINGS)
def test_reference_matches_authors(recorded, toy, key):
    _, ref = toy
    assert_matches_recording(recorded, key, _reference_decode(ref, recorded["settings"][key]), every=REFERENCE_EVERY)


def test_ties_decide_tokens(recorded, toy, monkeypatch):
    """Breaking equal confidences at the lowest position (a stable sort) instead of as torch.topk
    does changes the answer on some of the recorded prompts (at two tokens a step, on most of them;
    at one token a step topk's first maximum is the lowest position anyway): the tie order is part
    of the spec."""
    _, ref = toy

    def lowest_first(conf, k):
        return torch.sort(conf, descending=True, stable=True).indices[:k]

    monkeypatch.setattr(ref_window, "select", lowest_first)
    key = "gen64_steps32_w8_a2_r4"  # two tokens a step: ties at the count's boundary
    bad = mismatches(recorded, key, _reference_decode(ref, recorded["settings"][key]), every=REFERENCE_EVERY // 2)
    assert bad, "no recorded prompt depends on the tie order"


def test_pruned_steps_compute_few_queries_over_a_window(recorded, toy):
    """A pruned step computes a fraction of the canvas over a fraction of its keys; the counters
    add up."""
    engine, _ = toy
    prompt = torch.tensor(unpack(recorded["prompts"][0]))
    o = DecodeOptions(policy="window", gen_length=64, steps=64, window_tokens=16, active_tokens=8, refresh_interval=16)
    s = run_decode(engine.model.obj, prompt, o).stats
    L = prompt.numel() + 64
    assert (s["nfe"], s["nfe_full"], s["nfe_pruned"]) == (64, 4, 60)
    q = s["query_tokens_per_step"]
    assert [q[i] for i in range(0, 64, 16)] == [L] * 4
    pruned = [q[i] for i in range(64) if i % 16]
    assert max(pruned) < L and min(pruned) >= 1
    assert 0 < s["pruned_key_tokens"] < 60 * L
    assert sum(s["committed_per_step"]) == 64


REFUSALS = [
    (dict(factor=1.0), "factor"),
    (dict(stop_on_eos=True), "stop_on_eos"),
    (dict(steps=128), "steps"),
    (dict(steps=0), "steps"),
    (dict(edit_threshold=0.5), "edit_threshold"),
]


@pytest.mark.parametrize("kwargs,param", REFUSALS, ids=[p for _, p in REFUSALS])
def test_settings_their_code_cannot_run_are_refused(kwargs, param):
    with pytest.raises(RequestError) as e:
        DecodeOptions(policy="window", gen_length=64, **kwargs)
    assert (e.value.kind, e.value.param) == ("unsupported", param), str(e.value)
    assert param in str(e.value)


LLADA_REFUSALS = [
    (dict(slide_window=True), "slide_window", "Dream options"),
    (dict(early_stop=True), "early_stop", "Dream options"),
    (dict(active_tokens=1, steps=32), "active_tokens", "below the 2 tokens a step commits"),  # one active mask
]


@pytest.mark.parametrize("kwargs,param,words", LLADA_REFUSALS, ids=[p for _, p, _ in LLADA_REFUSALS])
def test_llada_rules_refuse_once_the_checkpoint_is_known(toy, kwargs, param, words):
    """The LLaDA row's own refusals (Dream's options; fewer active masks than a step commits), made
    when the checkpoint is known, naming the option."""
    engine, _ = toy
    with pytest.raises(RequestError) as e:
        engine.generate(["12+3=__?"], DecodeOptions(policy="window", gen_length=64, **kwargs))
    assert (e.value.kind, e.value.param) == ("unsupported", param), str(e.value)
    assert words in str(e.value)


def test_window_requests_batch_with_every_other_policy(tmp_path):
    """Window requests packed with vanilla / prefix / dual / blockbatch ones in the scheduler (a
    pruned step's gathered key list next to other rows' ranges, full steps next to cached blocks):
    every request's tokens and counters equal its decode alone."""
    import random

    from helpers.batching import mixed_requests, same, small_engine

    engine = small_engine(tmp_path / "m", "llada", seed=3)
    c = engine.config
    rng = random.Random(57)
    reqs = mixed_requests(rng, c.vocab_size, c.mask_token_id, 8, "llada")
    for i in range(6):
        G = rng.choice([16, 32, 64])
        prompt = [rng.randrange(1, c.vocab_size - 2) for _ in range(rng.choice([1, 5, 12]))]
        o = DecodeOptions(
            policy="window",
            gen_length=G,
            steps=rng.choice([G, G // 2]),
            window_tokens=rng.choice([0, 8, 64]),
            active_tokens=rng.choice([2, 4, 16]),
            refresh_interval=rng.choice([1, 4, 16]),
            temperature=(0.0, 0.8)[i % 2],
            seed=i,
        )
        reqs.insert(2 * i, (prompt, o))
    alone = [engine.generate([p], o)[0] for p, o in reqs]
    assert sum(a.stats["nfe_pruned"] for a in alone) > 0
    for max_batch in (3, 16):
        got = engine.generate([p for p, _ in reqs], [o for _, o in reqs], max_batch=max_batch)
        for i, (g, a) in enumerate(zip(got, alone)):
            same(g, a, f"request {i} ({reqs[i][1].policy}) at max_batch {max_batch}")
            assert g.stats["pruned_key_tokens"] == a.stats["pruned_key_tokens"]
