"""The single-branch policies' shared parts (vanilla, prefix, dual): their summary line, the
Fast-dLLM cached policies' tune rows, and LLaDA's reference entry (``reference.policies.generate``)."""

from __future__ import annotations

from ._common import dream_reference, fmt, tokens_per_forward


def summary(stats: dict) -> str:
    block = stats["branches"][0]["block_size"]
    where = f"block {block}" if block else "whole canvas"  # Dream's vanilla sampler has no blocks
    return (
        f"[{stats['policy']} {where}] nfe={stats['nfe']} "
        f"(full {stats['nfe_full']} + block {stats['nfe_block']}), {tokens_per_forward(stats):.2f} tokens/forward, "
        f"{stats['wall_ms']:.1f} ms"
    )


def unit_sizes(values: dict) -> list:
    """One block length: gen_length is a whole number of blocks."""
    from ..contract import DEFAULTS

    return [values.get("block_length", DEFAULTS["block_length"])]


# prefix / dual: the Fast-dLLM cached policies' tune axes and bench settings
CACHED_TUNE_AXES = ("block_lengths", "thresholds")


def cached_bench_options(name: str, gen_length: int) -> dict:
    """The paper's settings (docs/ALGORITHMS.md 3): block 32, threshold 0.9."""
    return dict(policy=name, block_length=32, threshold=0.9)


def cached_tune_rows(name: str, grid, gen_length: int) -> list[tuple[float, str]]:
    """prefix / dual: each block length that divides gen_length x each threshold, nearest the
    paper's 32 / 0.9 first."""
    rows = []
    for bl in grid.block_lengths:
        if gen_length % bl:
            continue
        for t in grid.thresholds:
            rows.append((abs(t - 0.9) + abs(bl - 32) / 320, f"{name}:block_length={bl},threshold={fmt(t)}"))
    return rows


def llada_reference(model, prompt, o, vocab_limit: int | None = None):
    """LLaDA's single-branch reference loop (its commit rules: threshold, factor, fixed schedule)."""
    from ..reference.policies import generate

    r = generate(
        model,
        prompt,
        o.gen_length,
        o.block_length,
        o.policy,
        steps=o.steps,
        threshold=o.threshold,
        factor=o.factor,
        temperature=o.temperature,
        seed=o.seed,
        stop_on_eos=o.eos_exit,
    )
    return r.tokens, r.nfe


# family -> reference entry, the same for the three single-branch policies
REFERENCE = {"llada": llada_reference, "dream": dream_reference}
