"""Requests for the batching tests: mixed policies, branch sets, gen_lengths and prompt lengths,
and the comparison of a batched result with the same request decoded alone."""

from __future__ import annotations

import random

from blockbatch import DecodeOptions, Engine, families
from blockbatch.random_checkpoint import make_random_checkpoint
from helpers import families as data

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


def _block(rng, G, i, family):  # blocks of 8 / 16 / 32 aligned at 0, 2.0 and 2.1 (editing)
    if family in data.UNMASKING_FAMILIES:  # SDAR: blocks of 4 / 8 / 16 aligned at 0, every unmasking rule
        rule = ("dynamic", "static", "sequential", "entropy_bounded")[i % 4]
        return DecodeOptions(
            policy="block",
            gen_length=G + rng.choice([0, 5]),
            block_length=rng.choice([4, 8, 16]),
            steps=rng.choice([None, 2]) if rule != "entropy_bounded" else None,
            threshold=rng.choice([0.6, 0.85]),
            unmasking=rule,
            entropy_bound=rng.choice([0.35, 1.5]) if rule == "entropy_bounded" else 0.35,
        )
    return DecodeOptions(
        policy="block",
        gen_length=G + rng.choice([0, 5]),
        block_length=rng.choice([8, 16, 32]),
        steps=rng.choice([None, 4]),
        threshold=rng.choice([0.6, 0.95]),
        edit_threshold=(None, 0.5)[i % 2],
        stop_on_eos=rng.choice([False, True]),
    )


def _wavefront(rng, G, i, family):  # LLaDA2.1 with 1..4 blocks in flight, several gates
    return DecodeOptions(
        policy="wavefront",
        gen_length=G + rng.choice([0, 5]),
        block_length=rng.choice([8, 16]),
        threshold=rng.choice([0.6, 0.95]),
        edit_threshold=rng.choice([0.5, 0.9]),
        max_active_blocks=rng.choice([1, 2, 3, 4]),
        spawn_threshold=rng.choice([0.0, 0.5, 1.0]),
        stop_on_eos=rng.choice([False, True]),
    )


def _vanilla(rng, G, i, family):
    return DecodeOptions(policy="vanilla", gen_length=G, **data.VANILLA_SCHEDULE.get(family, data.TIMESTEPS)(G))


def _blockbatch(rng, G, i, family):
    sizes = rng.choice([(4, 8, 16), (8, 16), (16,), None])
    return DecodeOptions(policy="blockbatch", gen_length=G, block_sizes=sizes, threshold=rng.choice([0.7, 0.9]))


def _window(rng, G, i, family):  # Window-Diffusion: phases of a full forward then pruned ones
    if family == "dream":  # a window holding the generation and a span that always holds the step's count
        early = rng.random() < 0.5
        return DecodeOptions(
            policy="window",
            gen_length=G,
            steps=rng.choice([G, G // 2]),
            window_tokens=G,
            active_tokens=rng.choice([4, 8]) if early else G,
            refresh_interval=rng.choice([1, 4, 16]),
            early_stop=early,
        )
    return DecodeOptions(
        policy="window",
        gen_length=G,
        steps=rng.choice([G, G // 2]),
        window_tokens=rng.choice([0, 8, 64]),
        active_tokens=rng.choice([2, 4, 16]),
        refresh_interval=rng.choice([1, 4, 16]),
    )


def _cached(policy):
    def options(rng, G, i, family):
        return DecodeOptions(
            policy=policy, gen_length=G, block_length=rng.choice([8, 16]), threshold=rng.choice([0.6, 0.9])
        )

    return options


# One request's options per policy (policy name -> builder(rng, gen_length, index, family)).
REQUEST_OPTIONS = {
    "vanilla": _vanilla,
    "prefix": _cached("prefix"),
    "dual": _cached("dual"),
    "blockbatch": _blockbatch,
    "block": _block,
    "window": _window,
    "wavefront": _wavefront,
}


def mixed_requests(rng: random.Random, vocab: int, mask: int, n: int, family: str):
    """n requests on ``family``: its policies in turn (families.REGISTRY POLICIES), mixed prompt
    lengths, gen_lengths and per-policy options."""
    policies = families.get(family).POLICIES
    reqs = []
    for i in range(n):
        prompt = [
            t if t != mask else 1 for t in (rng.randrange(vocab - 2) for _ in range(rng.choice([1, 3, 7, 12, 20])))
        ]
        policy = policies[i % len(policies)]
        G = rng.choice([16, 32, 64])
        reqs.append((prompt, REQUEST_OPTIONS[policy](rng, G, i, family)))
    return reqs


def same(a, b, what: str):
    assert a.raw_ids == b.raw_ids, f"{what}: tokens differ"
    for k in COUNTERS:
        assert a.stats[k] == b.stats[k], f"{what}: {k} {a.stats[k]} != {b.stats[k]}"


def small_engine(folder, family: str, seed: int) -> Engine:
    """A small random checkpoint of `family` (its shape: helpers/families.py SMALL_CHECKPOINT) written
    to `folder`, loaded."""
    make_random_checkpoint(folder, seed=seed, logit_scale=5.0, family=family, **data.small_checkpoint(family))
    return Engine.from_pretrained(folder)
