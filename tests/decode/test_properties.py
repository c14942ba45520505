"""Property tests (hypothesis): random valid options and prompts decode and keep the decode's
invariants; random invalid option values raise ValueError / TypeError naming the field; random
branch-state tables given to the bookkeeping ops succeed within bounds or raise, never crash
(that last one in a subprocess, so a crash fails one test)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockbatch.engine import Engine
from blockbatch.contract import MAX_ACTIVE_BLOCKS, MAX_GAP_TOKENS, MIN_PROB_FLOOR, POLICIES
from blockbatch.options import DecodeOptions

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True
)


@pytest.fixture(scope="module")
def engine():
    return Engine.from_pretrained()  # the shipped toy model: fast enough for dozens of decodes


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def valid_options(draw) -> DecodeOptions:
    # the toy is LLaDA: every policy but the block-causal families' block (test_llada2_native.py,
    # test_sdar_native.py) and wavefront (test_wavefront.py), and window, whose phases have their own
    # invariants (tests/decode/test_window.py)
    policy = draw(st.sampled_from([p for p in POLICIES if p not in ("block", "window", "wavefront")]))
    gen_length = draw(st.sampled_from([8, 16, 24, 32, 64]))
    common = dict(
        policy=policy,
        gen_length=gen_length,
        seed=draw(st.integers(0, 2**63 - 1)),
        temperature=draw(st.sampled_from([0.0, 0.0, 0.7])),
        stop_on_eos=draw(st.sampled_from([None, True, False])),
    )
    if policy != "blockbatch":
        block = draw(st.sampled_from(divisors(gen_length)))
        rule = draw(st.sampled_from(["threshold", "fixed", "factor"]))
        if rule == "threshold":
            extra = dict(threshold=draw(st.floats(0.05, 1.0)))
        elif rule == "factor":
            extra = dict(factor=draw(st.floats(0.1, 4.0)))
        else:
            blocks = gen_length // block
            extra = dict(threshold=None, steps=blocks * draw(st.integers(1, block)))
        return DecodeOptions(block_length=block, **common, **extra)
    sizes = draw(st.lists(st.sampled_from(divisors(gen_length)), min_size=1, max_size=6, unique=True))
    return DecodeOptions(
        block_sizes=tuple(sizes),
        threshold=draw(st.floats(0.05, 1.0)),
        merge_gate=draw(st.floats(0.05, 1.0)),
        sync_gap=draw(st.integers(0, 2 * gen_length)),
        refresh_tokens=draw(st.sampled_from([0, 4, 8, 32])),
        refresh_mode=draw(st.sampled_from(["periodic", "divergence"])),
        prob_floor=draw(st.floats(MIN_PROB_FLOOR, 0.5)),
        merge=draw(st.booleans()),
        sync=draw(st.booleans()),
        **common,
    )


def prompts(vocab: int, mask: int):
    return st.lists(st.integers(0, vocab - 1).filter(lambda t: t != mask), min_size=1, max_size=24)


@SETTINGS
@given(data=st.data())
def test_valid_options_decode_and_keep_the_invariants(engine, data):
    cfg = engine.config
    options = data.draw(valid_options())
    prompt = data.draw(prompts(cfg.vocab_size, cfg.mask_token_id))
    [g] = engine.generate(prompt, options)
    s = g.stats
    raw = g.raw_ids
    assert len(raw) == options.gen_length and g.prompt_ids == prompt
    if s["early_exit"]:  # BlockBatch stops once a branch's window is complete and holds EOS: the
        # canvas after that window is returned as it is, the answer (up to EOS) holds no mask
        assert cfg.eos_token_id in raw and cfg.mask_token_id not in raw[: raw.index(cfg.eos_token_id)]
        assert cfg.mask_token_id not in g.ids
    else:
        assert cfg.mask_token_id not in raw, "a finished decode leaves no mask"
    assert all(0 <= t < cfg.vocab_size for t in raw)
    assert s["nfe"] == s["nfe_full"] + s["nfe_block"] + s["nfe_init"] + s["nfe_refresh"]
    assert len(s["committed_per_step"]) == s["nfe"] == len(s["query_tokens_per_step"]) == len(s["key_tokens_per_step"])
    assert all(k >= 1 for k in s["key_tokens_per_step"])
    assert sum(s["committed_per_step"]) == sum(b["committed"] for b in s["branches"])
    assert all(c >= 0 for c in s["committed_per_step"])
    winner = s["branches"][s["winner"]]
    assert s["winner_block_size"] == winner["block_size"] and s["nfe_paper"] == winner["forwards"]
    if options.policy == "blockbatch":
        assert s["nfe_init"] == 1 and s["nfe_full"] == 0
        assert [b["block_size"] for b in s["branches"]] == sorted(options.block_sizes)
        assert all(b["forwards"] <= s["nfe"] for b in s["branches"])
        if not options.eos_exit:
            assert not s["early_exit"]
    else:
        assert s["nfe_init"] == s["nfe_refresh"] == 0
        blocks = options.gen_length // options.block_length
        if options.policy == "vanilla":
            assert s["nfe_block"] == 0
        else:
            assert s["nfe_full"] <= blocks  # one full forward per block start
        if not options.eos_exit:
            assert sum(s["committed_per_step"]) == options.gen_length  # every position committed once


# Values of the wrong type or out of range for each field (with a valid blockbatch / dual base).
INVALID = {
    "policy": st.one_of(st.text(max_size=8).filter(lambda v: v not in POLICIES), st.integers()),
    "gen_length": st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.text(max_size=3)),
    "block_length": st.one_of(st.integers(max_value=0), st.integers(129, 2**70), st.floats()),
    "threshold": st.one_of(st.floats().filter(lambda v: not 0 < v <= 1), st.text(max_size=3)),
    "factor": st.one_of(st.floats().filter(lambda v: not (v > 0 and v != float("inf"))), st.text(max_size=3)),
    "temperature": st.one_of(st.floats().filter(lambda v: not (0 <= v < float("inf"))), st.booleans()),
    "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63), st.floats(), st.booleans()),
    "stop_on_eos": st.one_of(st.integers(), st.text(max_size=3)),
    "block_sizes": st.one_of(
        st.just(()),
        st.lists(st.integers(max_value=0), min_size=1, max_size=3),
        st.lists(st.floats(), min_size=1, max_size=3),
        st.integers(),
    ),
    "merge_gate": st.one_of(st.floats().filter(lambda v: not 0 < v <= 1), st.text(max_size=3)),
    "sync_gap": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "refresh_tokens": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "refresh_mode": st.one_of(st.text(max_size=8).filter(lambda v: v not in ("periodic", "divergence")), st.integers()),
    "prob_floor": st.one_of(st.floats().filter(lambda v: not MIN_PROB_FLOOR <= v < 1), st.booleans()),
    "merge": st.one_of(st.integers(), st.text(max_size=3)),
    "sync": st.one_of(st.integers(), st.none()),
    "sync_refresh": st.one_of(st.integers(), st.none(), st.text(max_size=4)),
    "fold_rows": st.one_of(st.integers(), st.none(), st.text(max_size=4)),
    "share_prompt_kv": st.one_of(st.integers(), st.none(), st.text(max_size=4)),
    "branch_budget": st.one_of(st.text(max_size=8).filter(lambda v: v not in ("full", "auto")), st.integers()),
    "cuda_graphs": st.one_of(st.integers(), st.floats()),
    "timeout_s": st.one_of(st.floats().filter(lambda v: not (0 <= v < float("inf"))), st.text(max_size=3)),
    "steps": st.one_of(st.integers(max_value=-1), st.integers(min_value=129), st.floats(), st.text(max_size=3)),
    "alg": st.one_of(
        st.text(max_size=8).filter(lambda v: v not in ("confidence", "margin", "entropy", "origin")), st.integers()
    ),
    "alg_temp": st.one_of(st.floats().filter(lambda v: not (0 <= v < float("inf"))), st.text(max_size=3)),
    "eps": st.one_of(st.floats().filter(lambda v: not 0 < v < 1), st.booleans()),
    "top_p": st.one_of(st.floats().filter(lambda v: not 0 < v <= 1), st.text(max_size=3)),
    "top_k": st.one_of(st.integers(max_value=0), st.floats(), st.booleans()),
    "edit_threshold": st.one_of(st.floats().filter(lambda v: not 0 <= v <= 1), st.text(max_size=3)),
    "max_post_steps": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "unmasking": st.one_of(
        st.text(max_size=8).filter(lambda v: v not in ("dynamic", "static", "sequential", "entropy_bounded")),
        st.integers(),
    ),
    "entropy_bound": st.one_of(st.floats().filter(lambda v: not 0 < v < float("inf")), st.text(max_size=3)),
    "window_tokens": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "active_tokens": st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "refresh_interval": st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "slide_window": st.one_of(st.integers(), st.text(max_size=4)),
    "early_stop": st.one_of(st.integers(), st.text(max_size=4)),
    "max_active_blocks": st.one_of(
        st.integers(max_value=0), st.integers(min_value=MAX_ACTIVE_BLOCKS + 1), st.floats(), st.booleans()
    ),
    "spawn_threshold": st.one_of(st.floats().filter(lambda v: not 0 <= v <= 1), st.text(max_size=3)),
    "prefix_kv_budget": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "prefix_kv_min_context": st.one_of(
        st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats(), st.text(max_size=3)
    ),
    "query_keep_ratio": st.one_of(st.floats().filter(lambda v: not 0 < v <= 1), st.text(max_size=3)),
    "query_select_layer": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "query_reuse_interval": st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "query_dense_masks": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "query_min_context": st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_GAP_TOKENS + 1), st.floats()),
    "logprobs": st.one_of(st.integers(max_value=-1), st.integers(min_value=21), st.floats(), st.text(max_size=3)),
}


def test_every_field_has_invalid_values():
    assert set(INVALID) == {f.name for f in dataclasses.fields(DecodeOptions)}


@SETTINGS
@given(data=st.data())
def test_invalid_values_raise_naming_the_field(data):
    field = data.draw(st.sampled_from(sorted(INVALID)))
    value = data.draw(INVALID[field])
    base = (
        dict(policy="blockbatch", gen_length=128)
        if field in ("block_sizes", "merge_gate", "sync_gap", "refresh_tokens", "refresh_mode", "prob_floor")
        else dict(policy="dual", gen_length=128)
    )
    if field == "factor" and not isinstance(value, str):
        base["threshold"] = None
    if field == "steps":
        base["threshold"] = None
    base[field] = value
    with pytest.raises((ValueError, TypeError)) as info:
        DecodeOptions(**base)
    assert field in str(info.value), f"{field}={value!r}: {info.value}"


@pytest.mark.slow
def test_bookkeeping_ops_never_crash_on_random_state_tables():
    """Random (mostly invalid) state tables, spans and ids: each call either succeeds with every
    window inside the canvas, or raises ValueError. Run in a subprocess: a crash fails here."""
    code = textwrap.dedent("""
        import torch
        from hypothesis import given, settings, strategies as st
        import blockbatch.native
        from helpers.random_branch_state import BRANCH_FIELDS, FIELD, coordinate_args, random_branch_state
        ops = torch.ops.blockbatch
        big = st.one_of(st.integers(-5, 80), st.integers(-2**62, 2**62))
        counts = {"ok": 0, "rejected": 0}

        @settings(max_examples=300, deadline=None, derandomize=True)
        @given(seed=st.integers(0, 1000), edits=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 11), big),
               max_size=6), span=st.lists(big, min_size=5, max_size=5), eos=big, coordinate=st.booleans())
        def run(seed, edits, span, eos, coordinate):
            s = random_branch_state(seed)
            for b, f, v in edits:
                s["state"][b, f] = v
            L = s["canvas"].shape[1]
            canvas_before = s["canvas"].clone()
            try:
                if coordinate:
                    ops.bb_coordinate_(*coordinate_args(s))
                else:
                    logits = torch.randn(40, 10)
                    token, conf = ops.confidence(logits, 9)
                    ids, probs = ops.sparse_probs(logits, 0.1, 3)
                    ops.bb_absorb_(s["canvas"], s["state"], s["eos_prob"], s["map_ids"], s["map_probs"],
                                   torch.tensor([span]), token, conf, ids, probs, logits, 3, 9, eos, 0.9, True)
                counts["ok"] += 1
                live = s["state"][:, FIELD["done"]] == 0
                assert ((s["state"][live, FIELD["end"]] <= L) & (s["state"][live, FIELD["start"]] >= 3)).all()
            except ValueError:
                counts["rejected"] += 1
                assert torch.equal(s["canvas"], canvas_before), "a rejected call changed the canvas"

        run()
        print("DONE", counts["ok"], counts["rejected"])
        """)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    done = [line for line in proc.stdout.splitlines() if line.startswith("DONE")]
    assert done, proc.stdout
    ok, rejected = map(int, done[0].split()[1:])
    assert ok > 0 and rejected > 0, done  # both outcomes exercised
