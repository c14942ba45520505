"""Requests for the batching tests: mixed policies, branch sets, gen_lengths and prompt lengths,
and the comparison of a batched result with the same request decoded alone."""

from __future__ import annotations

import random

from blockbatch import DecodeOptions, Engine
from blockbatch.random_checkpoint import make_random_checkpoint

COUNTERS = (
    "nfe",
    "nfe_full",
    "nfe_block",
    "nfe_init",
    "nfe_refresh",
    "nfe_paper",
    "nfe_prefill",
    "nfe_store",
    "winner",
    "winner_block_size",
    "early_exit",
    "committed_per_step",
    "query_tokens_per_step",
    "branches",
)


def mixed_requests(rng: random.Random, vocab: int, mask: int, n: int, family: str):
    reqs = []
    for i in range(n):
        prompt = [
            t if t != mask else 1 for t in (rng.randrange(vocab - 2) for _ in range(rng.choice([1, 3, 7, 12, 20])))
        ]
        policy = ("vanilla", "prefix", "dual", "blockbatch")[i % 4] if family not in ("llada2", "sdar") else "block"
        G = rng.choice([16, 32, 64])
        if family == "sdar":  # SDAR: blocks of 4 / 8 / 16 aligned at 0, every unmasking rule
            rule = ("dynamic", "static", "sequential", "entropy_bounded")[i % 4]
            o = DecodeOptions(
                policy="block",
                gen_length=G + rng.choice([0, 5]),
                block_length=rng.choice([4, 8, 16]),
                steps=rng.choice([None, 2]) if rule != "entropy_bounded" else None,
                threshold=rng.choice([0.6, 0.85]),
                unmasking=rule,
                entropy_bound=rng.choice([0.35, 1.5]) if rule == "entropy_bounded" else 0.35,
            )
        elif policy == "block":  # LLaDA2: blocks of 8 / 16 / 32 aligned at 0, 2.0 and 2.1 (editing)
            o = DecodeOptions(
                policy="block",
                gen_length=G + rng.choice([0, 5]),
                block_length=rng.choice([8, 16, 32]),
                steps=rng.choice([None, 4]),
                threshold=rng.choice([0.6, 0.95]),
                edit_threshold=(None, 0.5)[i % 2],
                stop_on_eos=rng.choice([False, True]),
            )
        elif policy == "vanilla":
            o = (
                DecodeOptions(policy="vanilla", gen_length=G, block_length=16, threshold=None, steps=G)
                if family == "llada"
                else DecodeOptions(policy="vanilla", gen_length=G, steps=G // 2)
            )
        elif policy == "blockbatch":
            sizes = rng.choice([(4, 8, 16), (8, 16), (16,), None])
            o = DecodeOptions(policy="blockbatch", gen_length=G, block_sizes=sizes, threshold=rng.choice([0.7, 0.9]))
        else:
            o = DecodeOptions(
                policy=policy, gen_length=G, block_length=rng.choice([8, 16]), threshold=rng.choice([0.6, 0.9])
            )
        reqs.append((prompt, o))
    return reqs


def same(a, b, what: str):
    assert a.raw_ids == b.raw_ids, f"{what}: tokens differ"
    for k in COUNTERS:
        assert a.stats[k] == b.stats[k], f"{what}: {k} {a.stats[k]} != {b.stats[k]}"


def small_engine(folder, family: str, seed: int) -> Engine:
    """A small random checkpoint of `family` ("llada", "dream", "llada2" or "sdar") written to `folder`, loaded."""
    if family == "llada":
        make_random_checkpoint(folder, seed=seed, logit_scale=5.0, d_model=64, n_layers=2, vocab_size=97)
    elif family == "llada2":  # GQA, partial rotary, a dense layer then 8 experts top-2 + shared
        make_random_checkpoint(folder, seed=seed, logit_scale=5.0, vocab_size=64, n_layers=3, family="llada2")
    elif family == "sdar":  # GQA 4/2, QK-norm, full rotary
        make_random_checkpoint(folder, seed=seed, logit_scale=5.0, vocab_size=64, n_layers=3, family="sdar")
    else:
        make_random_checkpoint(folder, seed=seed, logit_scale=5.0, vocab_size=64, family="dream")
    return Engine.from_pretrained(folder)
