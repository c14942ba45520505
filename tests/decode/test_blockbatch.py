"""BlockBatch in the C++ loop vs the plain Python reference (ALGORITHMS.md section 4)."""

import itertools

import pytest
import torch

from blockbatch.native import NativeModel
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.reference.blockbatch import blockbatch_generate
from blockbatch.reference.model import ReferenceModel
from blockbatch.random_checkpoint import random_config, random_weights


@pytest.fixture(scope="module")
def models():
    # Small vocabulary + peaked LM head: branches agree often, so merges and syncs happen.
    config = random_config(d_model=64, n_heads=2, n_kv_heads=1, mlp_hidden_size=128, vocab_size=40)
    weights = random_weights(config, seed=1, logit_scale=8.0)
    return config, ReferenceModel(config, weights), NativeModel(config, weights)


def run_both(models, prompt, gen_length, **kw):
    config, ref, nat = models
    kw.setdefault("block_sizes", (4, 8, 16, 32, 64, 128))
    kw.setdefault("stop_on_eos", True)
    expected = blockbatch_generate(ref, prompt, gen_length, **kw)
    out = run_decode(nat.obj, prompt, DecodeOptions(policy="blockbatch", gen_length=gen_length, **kw))
    return expected, out


def assert_same(expected, out):
    s = out.stats
    assert torch.equal(out.tokens, expected.tokens)
    assert (s["nfe"], s["nfe_init"], s["nfe_block"], s["nfe_refresh"], s["nfe_paper"]) == (
        expected.nfe,
        expected.nfe_init,
        expected.nfe_block,
        expected.nfe_refresh,
        expected.nfe_paper,
    )
    assert (s["winner"], s["winner_block_size"], s["early_exit"]) == (
        expected.winner,
        expected.winner_block_size,
        expected.early_exit,
    )
    assert s["committed_per_step"] == expected.committed_per_step
    assert s["query_tokens_per_step"] == expected.query_tokens_per_step
    assert (s["folded_rows"], s["folded_tokens"]) == (expected.folded_rows, expected.folded_tokens)
    for b, e in zip(s["branches"], expected.branches):
        assert (b["block_size"], b["committed"], b["merged"], b["copied"], b["forwards"]) == (
            e.block_size,
            e.committed,
            e.merged,
            e.copied,
            e.forwards,
        )


GRID = [
    dict(block_sizes=sizes, gen_length=G, refresh_mode=mode, sync_gap=gap, merge_gate=gate, stop_on_eos=eos)
    for (sizes, G), mode, gap, gate, eos in itertools.product(
        [
            ((4, 8, 16, 32, 64, 128), 128),
            ((4, 8, 16, 32, 64, 128), 256),
            ((8, 32), 64),
            ((16,), 64),
            ((4, 64), 64),
            ((4, 64), 192),
        ],
        ["periodic", "divergence"],
        [4, 64],
        [0.3, 0.9],
        [True, False],
    )
    if not (mode == "divergence" and G == 256)  # keep the grid within CI time; divergence runs at 64..192
]


@pytest.mark.grid
@pytest.mark.parametrize("case", GRID, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()).replace(" ", ""))
def test_grid_matches_reference(models, case):
    config = models[0]
    kw = dict(case)
    gen_length = kw.pop("gen_length")
    g = torch.Generator().manual_seed(gen_length + len(kw["block_sizes"]))
    prompt = torch.randint(0, config.vocab_size - 2, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g)
    expected, out = run_both(models, prompt, gen_length, **kw)
    assert_same(expected, out)


@pytest.mark.slow
def test_every_mechanism_fired_in_the_grid(models):
    """The grid exercises merges, syncs and refreshes (EOS early exits need a model that emits
    EOS: see test_toy_model.py). Counted here from the engine alone, so the test stands on its
    own whatever order or selection the grid tests ran in."""
    config, _, nat = models
    fired = {"merged": 0, "copied": 0, "refresh": 0, "folded": 0}
    for case in GRID:
        kw = dict(case)
        gen_length = kw.pop("gen_length")
        g = torch.Generator().manual_seed(gen_length + len(kw["block_sizes"]))
        prompt = torch.randint(0, config.vocab_size - 2, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g)
        stats = run_decode(nat.obj, prompt, DecodeOptions(policy="blockbatch", gen_length=gen_length, **kw)).stats
        fired["merged"] += sum(b["merged"] for b in stats["branches"])
        fired["copied"] += sum(b["copied"] for b in stats["branches"])
        fired["refresh"] += stats["nfe_refresh"]
        fired["folded"] += stats["folded_rows"]
    assert all(v > 0 for v in fired.values()), fired


FOLD_CASES = [
    dict(block_sizes=(4, 8, 16, 32, 64, 128), gen_length=128, sync_gap=4, sync_refresh=True),
    dict(block_sizes=(8, 32), gen_length=64, sync_gap=4, refresh_tokens=8),
    dict(block_sizes=(4, 64), gen_length=192, merge_gate=0.3, refresh_mode="divergence"),
    dict(block_sizes=(4, 16, 64), gen_length=64, temperature=0.9, seed=7, sync_refresh=True),
]


def test_folding_changes_nothing_but_the_tokens_fed(models):
    """fold_rows on (the default) against off: the same tokens and every counter; each refresh feeds
    fewer query tokens by whole rows, and the rows folded account for the difference."""
    config, _, nat = models
    folded = 0
    for i, case in enumerate(FOLD_CASES):
        for seed in range(3):
            prompt = torch.randint(0, config.vocab_size - 2, (5 + i,), generator=torch.Generator().manual_seed(seed))
            o = DecodeOptions(policy="blockbatch", **case)
            on, off = run_decode(nat.obj, prompt, o), run_decode(nat.obj, prompt, o.replace(fold_rows=False))
            assert torch.equal(on.tokens, off.tokens), case
            fed = ("query_tokens_per_step", "key_tokens_per_step", "folded_rows", "folded_tokens", "wall_ms")
            assert {k: v for k, v in on.stats.items() if k not in fed} == {
                k: v for k, v in off.stats.items() if k not in fed
            }, case
            L = len(prompt) + case["gen_length"]
            diff = [b - a for a, b in zip(on.stats["query_tokens_per_step"], off.stats["query_tokens_per_step"])]
            assert all(d >= 0 and d % L == 0 for d in diff), case
            assert sum(diff) == on.stats["folded_tokens"] == L * on.stats["folded_rows"], case
            # a folded refresh row (a full forward) would have read its own L keys
            keys = [b - a for a, b in zip(on.stats["key_tokens_per_step"], off.stats["key_tokens_per_step"])]
            assert keys == diff, case
            assert off.stats["folded_rows"] == 0
            folded += on.stats["folded_rows"]
    assert folded > 0  # the cases do fold rows


def test_temperature_sampling_matches_reference(models):
    prompt = torch.tensor([3, 1, 4, 1, 5])
    expected, out = run_both(models, prompt, 64, block_sizes=(4, 16, 64), temperature=0.9, seed=7)
    assert_same(expected, out)


@pytest.mark.parametrize("switch", ["merge", "sync", "refresh"])
def test_disabling_a_mechanism_changes_results(models, switch):
    config, _, nat = models
    changes = {"merge": dict(merge=False), "sync": dict(sync=False), "refresh": dict(refresh_tokens=0)}[switch]
    changed = 0
    for seed in range(4):
        prompt = torch.randint(0, config.vocab_size - 2, (6,), generator=torch.Generator().manual_seed(seed))
        base = DecodeOptions(policy="blockbatch", gen_length=128, stop_on_eos=False)
        a = run_decode(nat.obj, prompt, base)
        b = run_decode(nat.obj, prompt, base.replace(**changes))
        stat = {"merge": "merged", "sync": "copied"}.get(switch)
        if stat:
            assert sum(x[stat] for x in b.stats["branches"]) == 0
        else:
            assert b.stats["nfe_refresh"] == 0
        changed += (not torch.equal(a.tokens, b.tokens)) or a.stats["nfe"] != b.stats["nfe"]
    assert changed > 0


def test_single_branch_one_block_equals_dual_cache(models):
    """One branch, one block (G = b), refresh disabled: dual cache, NFE = block steps + 1."""
    config, _, nat = models
    prompt = torch.tensor([7, 2, 9])
    bb = run_decode(
        nat.obj,
        prompt,
        DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(32,), refresh_tokens=0, stop_on_eos=False),
    )
    dual = run_decode(nat.obj, prompt, DecodeOptions(policy="dual", gen_length=32, block_length=32))
    assert torch.equal(bb.tokens, dual.tokens)
    assert bb.stats["nfe"] == bb.stats["nfe_block"] + 1 == dual.stats["nfe"]


@pytest.mark.parametrize("b,G", [(8, 64), (16, 64), (32, 128)])
def test_single_branch_refresh_every_block_equals_dual_cache(models, b, G):
    """With a refresh per block, a refresh is exactly dual cache's block-start full forward."""
    config, _, nat = models
    for seed in range(3):
        prompt = torch.randint(0, config.vocab_size - 2, (5,), generator=torch.Generator().manual_seed(seed))
        bb = run_decode(
            nat.obj,
            prompt,
            DecodeOptions(policy="blockbatch", gen_length=G, block_sizes=(b,), refresh_tokens=b, stop_on_eos=False),
        )
        dual = run_decode(nat.obj, prompt, DecodeOptions(policy="dual", gen_length=G, block_length=b))
        assert torch.equal(bb.tokens, dual.tokens)
        assert bb.stats["nfe"] == dual.stats["nfe"]
        assert bb.stats["committed_per_step"] == dual.stats["committed_per_step"]


def test_block_size_order_does_not_matter(models):
    config, _, nat = models
    prompt = torch.tensor([4, 4, 1])
    a = run_decode(nat.obj, prompt, DecodeOptions(policy="blockbatch", gen_length=128))
    b = run_decode(
        nat.obj, prompt, DecodeOptions(policy="blockbatch", gen_length=128, block_sizes=(64, 4, 128, 16, 8, 32))
    )
    assert torch.equal(a.tokens, b.tokens) and a.stats == {**b.stats, "wall_ms": a.stats["wall_ms"]}


def test_other_requests_do_not_change_a_result(models):
    from blockbatch.engine import Engine  # noqa: F401  (Engine decodes requests one by one)

    config, _, nat = models
    p1, p2 = torch.tensor([5, 6, 7]), torch.tensor([9, 9])
    options = DecodeOptions(policy="blockbatch", gen_length=128)
    alone = run_decode(nat.obj, p1, options)
    run_decode(nat.obj, p2, options)
    again = run_decode(nat.obj, p1, options)
    assert torch.equal(alone.tokens, again.tokens)


# ----------------------------------------------------------------------------- bad input


# One list for both languages: DecodeOptions calls the C++ validator, so the op and Python give
# the very same message.
BAD_BLOCKBATCH_OPTIONS = [
    (dict(block_sizes=[]), r"block_sizes must be a non-empty list of block sizes"),
    (dict(block_sizes=[4, 4]), r"block_sizes must not repeat a size, got 4 twice"),
    (dict(block_sizes=[4, 48]), r"block size 48 in block_sizes must be a positive divisor of gen_length = 128"),
    (dict(block_sizes=list(range(1, 18))), r"block_sizes may hold at most 16 entries, got 17"),
    (dict(block_sizes=[0, 4]), r"block_sizes must be >= 1, got 0"),
    (dict(merge_gate=0.0), r"merge_gate must be in \(0, 1\], got 0"),
    (dict(merge_gate=1.2), r"merge_gate must be in \(0, 1\], got 1.2"),
    (dict(threshold=0.0), r"threshold must be in \(0, 1\], got 0"),
    (dict(threshold=1.5), r"threshold must be in \(0, 1\], got 1.5"),
    (dict(sync_gap=-1), r"sync_gap must be in \[0, 2\^30\], got -1"),
    (dict(refresh_tokens=-3), r"refresh_tokens must be in \[0, 2\^30\], got -3"),
    (dict(refresh_mode="sometimes"), r"refresh_mode must be one of 'periodic', 'divergence', got 'sometimes'"),
    (dict(prob_floor=1.0), r"prob_floor must be in \[0.01, 1\), got 1"),
    (dict(prob_floor=0.001), r"prob_floor must be in \[0.01, 1\), got 0.001"),
    (dict(factor=2.0), r"policy 'blockbatch' commits by threshold: set threshold and leave factor None"),
]


@pytest.mark.parametrize("kwargs,pattern", BAD_BLOCKBATCH_OPTIONS)
def test_cpp_rejects_bad_blockbatch_options(models, kwargs, pattern):
    _, _, nat = models
    args = dict(policy="blockbatch", gen_length=128)
    args.update(kwargs)
    with pytest.raises(ValueError, match="^" + pattern):
        torch.ops.blockbatch.decode(nat.obj, torch.tensor([1, 2]), **args)


@pytest.mark.parametrize("kwargs,pattern", BAD_BLOCKBATCH_OPTIONS)
def test_python_rejects_bad_blockbatch_options(kwargs, pattern):
    with pytest.raises(ValueError, match="^" + pattern):
        DecodeOptions(policy="blockbatch", gen_length=128, **kwargs)


# The sync_refresh variant (ALGORITHMS.md 10.3; opt-in, not the authors' semantics): the engine
# equals the reference with it on, in both refresh modes and with refreshes otherwise off; and it
# does something (refreshes follow syncs) where the default run syncs.
SYNC_REFRESH = [
    dict(block_sizes=sizes, gen_length=G, refresh_mode=mode, refresh_tokens=rt, sync_gap=gap, stop_on_eos=eos)
    for (sizes, G), mode, rt, gap, eos in itertools.product(
        [((4, 8, 16, 32, 64, 128), 128), ((8, 32), 64), ((4, 64), 192)],
        ["periodic", "divergence"],
        [0, 32],
        [4],
        [True, False],
    )
    if not (mode == "divergence" and rt == 0)
]


@pytest.mark.grid
@pytest.mark.parametrize("case", SYNC_REFRESH, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()).replace(" ", ""))
def test_sync_refresh_variant_matches_reference(models, case):
    config = models[0]
    kw = dict(case)
    gen_length = kw.pop("gen_length")
    g = torch.Generator().manual_seed(gen_length + len(kw["block_sizes"]) + 11)
    prompt = torch.randint(0, config.vocab_size - 2, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g)
    expected, out = run_both(models, prompt, gen_length, sync_refresh=True, **kw)
    assert_same(expected, out)


def test_sync_refresh_refreshes_after_syncs_and_only_then(models):
    config, _, nat = models
    more = 0
    for seed in range(6):
        prompt = torch.randint(0, config.vocab_size - 2, (6,), generator=torch.Generator().manual_seed(seed))
        base = DecodeOptions(policy="blockbatch", gen_length=128, refresh_tokens=0, sync_gap=4, stop_on_eos=False)
        a = run_decode(nat.obj, prompt, base)
        b = run_decode(nat.obj, prompt, base.replace(sync_refresh=True))
        assert a.stats["nfe_refresh"] == 0
        if sum(x["copied"] for x in a.stats["branches"]) == 0:  # no sync, nothing to refresh: the same decode
            assert torch.equal(a.tokens, b.tokens) and a.stats["nfe"] == b.stats["nfe"]
        more += b.stats["nfe_refresh"] > 0
        nosync = run_decode(nat.obj, prompt, base.replace(sync_refresh=True, sync=False))
        assert nosync.stats["nfe_refresh"] == 0  # refreshes come from syncs only
    assert more > 0
