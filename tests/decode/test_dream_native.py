"""The native Dream decoders (torch.ops.blockbatch.decode on a Dream checkpoint) against the
authors' recorded runs and the float32 reference (blockbatch.reference.dream), token for token and
NFE for NFE, in float32 on the CPU.

Two sets of cases:

- the authors' fixture (tests/fixtures/authors_dream_random.json, tests/helpers/dream_cases.py):
  every recorded run, decoded by ``Engine.from_pretrained(dir).generate([ids], DecodeOptions(...))``
  as a user calls it, must give the authors' tokens (up to the winner's EOS) and NFE;
- more shapes against the reference: a larger GQA checkpoint with biases (3 KV heads under 6 query
  heads), longer prompts and canvases, and BlockBatch settings that make merges, syncs and
  refreshes all fire (asserted on the counters).
"""

from __future__ import annotations

import json
import os

import pytest

from blockbatch import DecodeOptions, Engine
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.loading import load_checkpoint
from blockbatch.reference.dream import dream_blockbatch, dream_cached, dream_vanilla
from blockbatch.reference.model import ReferenceModel

from helpers.dream_cases import CASES, CHECKPOINT

FIXTURE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "authors_dream_random.json"
)
ALG = {"maskgit_plus": "confidence", "topk_margin": "margin", "entropy": "entropy", "origin": "origin"}


def options_for(case: dict) -> DecodeOptions:
    """The engine's options for one recorded case (Dream's names mapped to the engine's)."""
    p = case["policy"]
    if p == "vanilla":
        return DecodeOptions(
            policy="vanilla",
            gen_length=case["gen_length"],
            steps=case["steps"],
            alg=ALG[case["alg"]],
            alg_temp=float(case.get("alg_temp") or 0.0),
            eps=case.get("eps", 1e-3),
            seed=case.get("seed", 0),
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    if p in ("dual", "prefix"):
        return DecodeOptions(
            policy=p,
            gen_length=case["gen_length"],
            block_length=case["block_length"],
            threshold=case["threshold"],
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    return DecodeOptions(
        policy="blockbatch",
        gen_length=case["gen_length"],
        block_sizes=tuple(case["block_sizes"]),
        threshold=case["threshold"],
        refresh_tokens=case["refresh_tokens"],
        sync_gap=case["sync_gap"],
        stop_on_eos=case["stop_on_eos"],
        merge=case.get("merge", True),
        sync=case.get("sync", True),
        sync_refresh=case.get("sync_refresh", False),
    )


def reference_for(model: ReferenceModel, case: dict):
    p = case["policy"]
    if p == "vanilla":
        return dream_vanilla(
            model,
            case["prompt"],
            case["gen_length"],
            case["steps"],
            alg=case["alg"],
            alg_temp=case.get("alg_temp") or 0.0,
            eps=case.get("eps", 1e-3),
            seed=case.get("seed", 0),
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    if p in ("dual", "prefix"):
        return dream_cached(
            model,
            case["prompt"],
            case["gen_length"],
            case["block_length"],
            case["threshold"],
            dual=p == "dual",
            top_p=case.get("top_p"),
            top_k=case.get("top_k"),
        )
    return dream_blockbatch(
        model,
        case["prompt"],
        case["gen_length"],
        case["block_sizes"],
        threshold=case["threshold"],
        refresh_tokens=case["refresh_tokens"],
        sync_gap=case["sync_gap"],
        stop_on_eos=case["stop_on_eos"],
        merge=case.get("merge", True),
        sync=case.get("sync", True),
        sync_refresh=case.get("sync_refresh", False),
    )


def assert_same_row(native_raw: list[int], prompt: list[int], want: list[int], eos: int, name: str) -> None:
    """The native canvas (prompt + generation) equals `want`; a `want` cut after its EOS (BlockBatch's
    early exit) continues with EOS in the native row."""
    row = list(prompt) + list(native_raw)
    assert row[: len(want)] == want, f"{name}: tokens differ"
    assert all(t == eos for t in row[len(want) :]), f"{name}: the row continues past the cut with non-EOS tokens"


@pytest.fixture(scope="module")
def fixture():
    with open(FIXTURE, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def authors_engine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dream-authors")
    make_random_checkpoint(folder, **CHECKPOINT, family="dream")
    return Engine.from_pretrained(folder)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c["name"] for c in CASES])
def test_native_matches_authors(authors_engine, fixture, index):
    want = fixture["cases"][index]
    assert authors_engine.config.family == "dream"
    g = authors_engine.generate([want["prompt"]], options_for(want))[0]
    assert_same_row(g.raw_ids, want["prompt"], want["tokens"], authors_engine.config.eos_token_id, want["name"])
    assert g.stats["nfe"] == want["nfe"], f"{want['name']}: NFE {g.stats['nfe']} != authors' {want['nfe']}"
    if want["policy"] == "blockbatch":
        s = want["stats"]
        assert (g.stats["nfe_init"], g.stats["nfe_block"], g.stats["nfe_refresh"]) == (
            s["nfe_init"],
            s["nfe_block"],
            s["nfe_refresh"],
        )
        assert g.stats["winner_block_size"] == s["final_block_size"]
        assert g.stats["early_exit"] == (s["exit_reason"] == "eos_ready")
        assert sum(b["merged"] for b in g.stats["branches"]) == s["merged_tokens"]
        assert sum(b["copied"] for b in g.stats["branches"]) == s["copied_tokens"]


# ------------------------------------------------------------------ more shapes, against the reference

GQA = dict(seed=7, logit_scale=4.0, vocab_size=48, d_model=96, n_heads=6, n_kv_heads=3, n_layers=2, mlp_hidden_size=160)
PROMPTS = {"p1": [5], "p9": [3, 9, 27, 1, 44, 2, 8, 8, 19], "p20": [(7 * i + 3) % 45 for i in range(20)]}


def _more_cases() -> list[dict]:
    cases = []
    for name in PROMPTS:
        for alg in ("maskgit_plus", "entropy", "topk_margin"):
            cases.append(
                dict(
                    name=f"vanilla-{alg}-{name}",
                    policy="vanilla",
                    alg=alg,
                    prompt=PROMPTS[name],
                    gen_length=48,
                    steps=24,
                )
            )
        for policy in ("dual", "prefix"):
            cases.append(
                dict(
                    name=f"{policy}-{name}",
                    policy=policy,
                    prompt=PROMPTS[name],
                    gen_length=96,
                    block_length=16,
                    threshold=0.8,
                )
            )
        for stop in (False, True):
            cases.append(
                dict(
                    name=f"blockbatch-{'eos' if stop else 'full'}-{name}",
                    policy="blockbatch",
                    prompt=PROMPTS[name],
                    gen_length=96,
                    block_sizes=[4, 8, 16, 32],
                    threshold=0.8,
                    refresh_tokens=16,
                    sync_gap=4,
                    stop_on_eos=stop,
                )
            )
    cases.append(
        dict(
            name="vanilla-origin-p9",
            policy="vanilla",
            alg="origin",
            prompt=PROMPTS["p9"],
            gen_length=48,
            steps=12,
            seed=3,
        )
    )
    cases.append(
        dict(
            name="vanilla-alg_temp-top_p-p9",
            policy="vanilla",
            alg="entropy",
            prompt=PROMPTS["p9"],
            gen_length=48,
            steps=12,
            seed=4,
            alg_temp=0.3,
            top_p=0.8,
        )
    )
    cases.append(
        dict(
            name="dual-top_k-p9",
            policy="dual",
            prompt=PROMPTS["p9"],
            gen_length=64,
            block_length=32,
            threshold=0.7,
            top_k=3,
        )
    )
    cases.append(
        dict(
            name="blockbatch-no-merge-no-sync-p9",
            policy="blockbatch",
            prompt=PROMPTS["p9"],
            gen_length=64,
            block_sizes=[8, 32],
            threshold=0.9,
            refresh_tokens=0,
            sync_gap=8,
            stop_on_eos=False,
            merge=False,
            sync=False,
        )
    )
    for name in ("p1", "p9"):  # the sync_refresh variant (ALGORITHMS.md 10.3), with and without periodic refreshes
        for rt in (0, 16):
            cases.append(
                dict(
                    name=f"blockbatch-sync_refresh-rt{rt}-{name}",
                    policy="blockbatch",
                    prompt=PROMPTS[name],
                    gen_length=96,
                    block_sizes=[4, 8, 16, 32],
                    threshold=0.8,
                    refresh_tokens=rt,
                    sync_gap=4,
                    stop_on_eos=False,
                    sync_refresh=True,
                )
            )
    return cases


MORE = _more_cases()


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dream-gqa")
    make_random_checkpoint(folder, **GQA, family="dream")
    return Engine.from_pretrained(folder), ReferenceModel.from_checkpoint(load_checkpoint(folder))


@pytest.fixture(scope="module")
def more_results(gqa):
    engine, ref = gqa
    out = {}
    for case in MORE:
        out[case["name"]] = (engine.generate([case["prompt"]], options_for(case))[0], reference_for(ref, case))
    return out


@pytest.mark.parametrize("name", [c["name"] for c in MORE])
def test_native_matches_reference(gqa, more_results, name):
    case = next(c for c in MORE if c["name"] == name)
    g, r = more_results[name]
    assert_same_row(g.raw_ids, case["prompt"], r.tokens, gqa[0].config.eos_token_id, name)
    assert g.stats["nfe"] == r.nfe
    if case["policy"] == "blockbatch":
        assert (g.stats["nfe_init"], g.stats["nfe_block"], g.stats["nfe_refresh"]) == (
            r.stats["nfe_init"],
            r.stats["nfe_block"],
            r.stats["nfe_refresh"],
        )
        assert g.stats["winner_block_size"] == r.stats["winner_block_size"]
        # fold_rows (on by default): the refresh rows not fed and the query tokens fed, step by step
        assert g.stats["folded_rows"] == r.stats["folded_rows"]
        assert g.stats["query_tokens_per_step"] == r.stats["query_tokens_per_step"]
        for gb, rb in zip(g.stats["branches"], r.stats["branches"]):
            assert (gb["block_size"], gb["committed"], gb["merged"], gb["copied"]) == (
                rb["block_size"],
                rb["committed"],
                rb["merged"],
                rb["copied"],
            )


def test_blockbatch_cases_fire_merges_syncs_and_refreshes(more_results):
    # (both exits, EOS-ready and complete, fire in the authors' cases: test_native_matches_authors
    # asserts early_exit per case, and the fixture covers both)
    bb = [(c, more_results[c["name"]][0].stats) for c in MORE if c["policy"] == "blockbatch" and c.get("merge", True)]
    assert sum(b["merged"] for _, s in bb for b in s["branches"]) > 0
    assert sum(b["copied"] for _, s in bb for b in s["branches"]) > 0
    assert sum(s["nfe_refresh"] for _, s in bb) > 0
    assert sum(s["folded_rows"] for _, s in bb) > 0  # and some refresh rows were folded
    off = more_results["blockbatch-no-merge-no-sync-p9"][0].stats
    assert sum(b["merged"] + b["copied"] for b in off["branches"]) == 0 and off["nfe_refresh"] == 0
    # sync_refresh without periodic refreshes: its refreshes follow syncs
    sr = [more_results[f"blockbatch-sync_refresh-rt0-{n}"][0].stats for n in ("p1", "p9")]
    assert sum(s["nfe_refresh"] for s in sr) > 0
    assert all(s["nfe_refresh"] == 0 for s in sr if sum(b["copied"] for b in s["branches"]) == 0)


def test_family_defaults_apply_when_unset(authors_engine, fixture):
    """DecodeOptions left unset decode a Dream checkpoint with Dream's published defaults: the
    BlockBatch fixture case run with only policy and gen_length gives the same result."""
    want = next(c for c in fixture["cases"] if c["name"] == "blockbatch-full-p12")
    g = authors_engine.generate([want["prompt"]], DecodeOptions(policy="blockbatch", gen_length=64))[0]
    assert_same_row(g.raw_ids, want["prompt"], want["tokens"], authors_engine.config.eos_token_id, want["name"])
    assert g.stats["nfe"] == want["nfe"]
    assert [b["block_size"] for b in g.stats["branches"]] == [4, 8, 16, 32, 64]
    van = next(c for c in fixture["cases"] if c["name"] == "vanilla-entropy-pad5-steps32")
    g = authors_engine.generate([van["prompt"]], DecodeOptions(policy="vanilla", gen_length=32))[0]
    assert_same_row(g.raw_ids, van["prompt"], van["tokens"], authors_engine.config.eos_token_id, van["name"])
    assert g.stats["nfe"] == 32  # steps = gen_length, alg = entropy


# The options Dream's decoders refuse, LLaDA's refusal of Dream's samplers and the policies a family
# does not decode: test_family_decode.py (rows in tests/helpers/families.py).


def test_ids_the_tokenizer_cannot_produce_are_never_proposed(tmp_path):
    """A Dream embedding table larger than its tokenizer (Dream-7B: 152064 rows): the decoders
    propose only ids the tokenizer can produce, in every policy, native == reference."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(30)}, unk_token="t0"))
    make_random_checkpoint(
        tmp_path,
        seed=3,
        logit_scale=4.0,
        vocab_size=48,
        eos_token_id=20,
        mask_token_id=21,
        tokenizer=tok,
        family="dream",
    )
    engine = Engine.from_pretrained(tmp_path)
    assert engine.checkpoint.proposal_vocab == 30
    ref = ReferenceModel.from_checkpoint(load_checkpoint(tmp_path))
    prompt = [3, 14, 15, 9, 2]
    cases = [
        dict(name="vanilla", policy="vanilla", alg="entropy", prompt=prompt, gen_length=32, steps=16),
        dict(name="dual", policy="dual", prompt=prompt, gen_length=32, block_length=16, threshold=0.9),
        dict(name="prefix", policy="prefix", prompt=prompt, gen_length=32, block_length=16, threshold=0.9),
        dict(
            name="blockbatch",
            policy="blockbatch",
            prompt=prompt,
            gen_length=32,
            block_sizes=[4, 8, 16, 32],
            threshold=0.9,
            refresh_tokens=32,
            sync_gap=8,
            stop_on_eos=False,
        ),
    ]
    unrestricted_out_of_range = 0
    for case in cases:
        g = engine.generate([prompt], options_for(case))[0]
        assert max(g.raw_ids) < 30, f"{case['name']}: proposed an id the tokenizer cannot produce"
        if case["policy"] == "vanilla":
            r = dream_vanilla(ref, prompt, 32, 16, alg="entropy", vocab_limit=30)
            free = dream_vanilla(ref, prompt, 32, 16, alg="entropy")
        elif case["policy"] == "blockbatch":
            r = dream_blockbatch(ref, prompt, 32, [4, 8, 16, 32], vocab_limit=30)
            free = dream_blockbatch(ref, prompt, 32, [4, 8, 16, 32])
        else:
            r = dream_cached(ref, prompt, 32, 16, 0.9, dual=case["policy"] == "dual", vocab_limit=30)
            free = dream_cached(ref, prompt, 32, 16, 0.9, dual=case["policy"] == "dual")
        assert_same_row(g.raw_ids, prompt, r.tokens, 20, case["name"])
        assert g.stats["nfe"] == r.nfe
        unrestricted_out_of_range += max(free.tokens[len(prompt) :]) >= 30
    assert unrestricted_out_of_range > 0  # without the restriction this model does propose them


def _random_case(rng, V: int, mask: int):
    """Random options of every Dream policy (sampling, filters, switches, family defaults)."""
    import random  # noqa: F401  (rng is a random.Random)

    prompt = [t if t != mask else 0 for t in (rng.randrange(V - 1) for _ in range(rng.choice([1, 2, 5, 13])))]
    pol = rng.choice(["vanilla", "prefix", "dual", "blockbatch"])
    if pol == "vanilla":
        G = rng.choice([8, 16, 33, 48])
        o = DecodeOptions(
            policy=pol,
            gen_length=G,
            steps=rng.choice([None, 1, G // 2, G]),
            alg=rng.choice(["confidence", "margin", "entropy", "origin"]),
            alg_temp=rng.choice([0.0, 0.0, 0.5]),
            seed=rng.randrange(100),
            top_p=rng.choice([None, 0.8]),
            top_k=rng.choice([None, 3]),
            temperature=rng.choice([0.0, 0.0, 0.7]),
            stop_on_eos=rng.choice([None, True, False]),
        )
    elif pol in ("prefix", "dual"):
        b = rng.choice([1, 4, 8, 16])
        o = DecodeOptions(
            policy=pol,
            gen_length=b * rng.choice([1, 2, 3]),
            block_length=b,
            threshold=rng.choice([0.5, 0.9, 0.99]),
            top_p=rng.choice([None, 0.9]),
            top_k=rng.choice([None, 2]),
            stop_on_eos=rng.choice([None, True, False]),
        )
    else:
        G = rng.choice([16, 32, 64])
        sizes = tuple(sorted(rng.sample([s for s in (1, 2, 4, 8, 16, 32, 64) if G % s == 0], rng.choice([1, 2, 3, 5]))))
        o = DecodeOptions(
            policy=pol,
            gen_length=G,
            block_sizes=rng.choice([None, sizes]),
            threshold=rng.choice([0.5, 0.9, 0.99]),
            stop_on_eos=rng.choice([None, True, False]),
            sync_gap=rng.choice([0, 2, 8]),
            refresh_tokens=rng.choice([0, 4, 32]),
            merge_gate=rng.choice([0.3, 0.5, 0.9]),
            prob_floor=rng.choice([None, 0.1, 0.3]),
            merge=rng.choice([True, False]),
            sync=rng.choice([True, False]),
        )
    return prompt, o


@pytest.mark.grid
@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_random_options_native_equals_reference(tmp_path, seed):
    """Random Dream checkpoints (vocabularies 16..64, logit scales 2..9, 1..4 KV heads) and random
    options of every policy: the native row, NFE and errors equal the reference's (450 such cases
    ran clean when this was written; each seed here runs 50)."""
    import random

    from blockbatch.reference.dream import decode_with_options

    rng = random.Random(seed)
    for ck in range(2):
        folder = tmp_path / f"ck{ck}"
        V = rng.choice([16, 24, 40, 64])
        make_random_checkpoint(
            folder,
            seed=10 * seed + ck,
            logit_scale=rng.choice([2.0, 4.0, 6.0, 9.0]),
            vocab_size=V,
            d_model=rng.choice([32, 64]),
            n_heads=4,
            n_kv_heads=rng.choice([1, 2, 4]),
            family="dream",
        )
        engine = Engine.from_pretrained(folder)
        ref = ReferenceModel.from_checkpoint(load_checkpoint(folder))
        eos = engine.config.eos_token_id
        for _ in range(25):
            prompt, o = _random_case(rng, V, engine.config.mask_token_id)
            try:
                g = engine.generate([prompt], o)[0]
                got, got_error = (prompt + g.raw_ids, g.stats["nfe"]), None
            except (ValueError, RuntimeError) as e:
                got, got_error = None, type(e).__name__
            try:
                r = decode_with_options(ref, prompt, o)
                want, want_error = (r.tokens + [eos] * (len(prompt) + o.gen_length - len(r.tokens)), r.nfe), None
            except (ValueError, RuntimeError) as e:
                want, want_error = None, type(e).__name__
            assert (got, got_error is None) == (want, want_error is None), (prompt, o, got_error, want_error)


@pytest.mark.parametrize("policy", ["vanilla", "prefix", "dual"])
def test_stop_on_eos_in_single_branch_policies(tmp_path, policy):
    """stop_on_eos on Dream's single-branch policies (not in the authors' decoders, off by default):
    the block that holds the first EOS ends the decode and the rest of the canvas is EOS, natively
    as in the reference, with fewer forwards than without it wherever that block is not the last."""
    make_random_checkpoint(tmp_path, seed=5, logit_scale=3.0, vocab_size=16, eos_token_id=3, family="dream")
    engine = Engine.from_pretrained(tmp_path)
    ref = ReferenceModel.from_checkpoint(load_checkpoint(tmp_path))
    eos = engine.config.eos_token_id
    kw = dict(steps=16) if policy == "vanilla" else dict(block_length=4, threshold=0.9)
    stopped_early = 0
    for p in range(12):
        prompt = [(7 * p + k) % 15 for k in range(1 + p % 4)]
        prompt = [t if t != engine.config.mask_token_id else 0 for t in prompt]
        on, off = (DecodeOptions(policy=policy, gen_length=16, stop_on_eos=stop, **kw) for stop in (True, False))
        g_on, g_off = engine.generate([prompt], on)[0], engine.generate([prompt], off)[0]
        if policy == "vanilla":
            r = dream_vanilla(ref, prompt, 16, 16, stop_on_eos=True)
        else:
            r = dream_cached(ref, prompt, 16, 4, 0.9, dual=policy == "dual", stop_on_eos=True)
        assert prompt + g_on.raw_ids == r.tokens and g_on.stats["nfe"] == r.nfe, (policy, p)
        if eos in g_on.raw_ids:
            first = g_on.raw_ids.index(eos)
            end = (first // 4 + 1) * 4 if policy != "vanilla" else 16
            assert all(t == eos for t in g_on.raw_ids[end:])
            if end < 16:
                stopped_early += 1
                assert g_on.stats["nfe"] < g_off.stats["nfe"]
                assert g_on.raw_ids[:end] == g_off.raw_ids[:end]
    if policy != "vanilla":
        assert stopped_early > 0, "no prompt of this checkpoint decoded an EOS before its last block"
