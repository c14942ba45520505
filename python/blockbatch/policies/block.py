"""Policy ``block``: the decoder of block-causal checkpoints (LLaDA2, SDAR): blocks aligned at 0 decoded in
turn over the exact block cache, LLaDA2.0's threshold rule and LLaDA2.1's token editing
(docs/ALGORITHMS.md 11), SDAR's unmasking rules (docs/sdar.md)."""

from __future__ import annotations

from ._common import fmt, tokens_per_forward

NAME = "block"
MULTI_BRANCH = False
OPTION_GROUP_HELP = "block: DUET sparsity (ALGORITHMS.md 18); edit_threshold, max_post_steps: the llada2 group"
TUNE_AXES = ("block_lengths", "thresholds", "unmasking")


def bench_options(gen_length: int) -> dict:
    """LLaDA2.0's settings: block 32, threshold 0.95."""
    return dict(policy=NAME, block_length=32, threshold=0.95)


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    """Each block length (need not divide gen_length: blocks are aligned at 0) x threshold, with and
    without LLaDA2.1's editing (edit_threshold 0.5); LLaDA2.0's 32 / 0.95 first. With a grid of
    ``unmasking`` rules (SDAR's family grid): each rule x block length (x threshold for dynamic), the
    authors' dynamic / 0.85 first."""
    rows = []
    if grid.unmasking:
        for rule in grid.unmasking:
            for bl in grid.block_lengths:
                for t in grid.thresholds if rule == "dynamic" else (None,):
                    spec = f"block:block_length={bl},unmasking={rule}"
                    spec += f",threshold={fmt(t)}" if t is not None else ""
                    rank = (abs(t - 0.85) if t is not None else 0.05) + abs(bl - 4) / 320
                    rows.append((rank + (0 if rule == "dynamic" else 0.01), spec))
        return rows
    for bl in grid.block_lengths:
        for t in grid.thresholds:
            for edit in (None, 0.5):
                spec = f"block:block_length={bl},threshold={fmt(t)}"
                if edit is not None:
                    spec += f",edit_threshold={fmt(edit)}"
                rows.append((abs(t - 0.95) + abs(bl - 32) / 320 + (0.01 if edit else 0), spec))
    return rows


def summary(stats: dict) -> str:
    """Forwards over the exact block cache, edits (LLaDA2.1)."""
    block = stats["branches"][0]["block_size"]
    return (
        f"[block {block}] nfe={stats['nfe']}, {tokens_per_forward(stats):.2f} tokens/forward, {stats['edits']} edits, "
        f"{stats['wall_ms']:.1f} ms"
    )


def llada2_reference(model, prompt, o, vocab_limit: int | None = None):
    """LLaDA2's block decoder over its exact cache (``reference.llada2.block_generate``); ``model``:
    an ``LLaDA2Reference`` holding the checkpoint's mask and EOS ids."""
    from ..reference.llada2 import block_generate

    assert model.mask_id is not None and model.eos_id is not None
    canvas, stats = block_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        block_length=o.block_length,
        steps=o.steps or o.block_length,
        threshold=float("inf") if o.threshold is None else o.threshold,
        edit_threshold=o.edit_threshold,
        max_post_steps=o.max_post_steps,
        stop_on_eos=o.eos_exit,
        eos_id=model.eos_id,
        mask_id=model.mask_id,
        cache=True,
    )
    return canvas, stats["nfe"]


def sdar_reference(model, prompt, o, vocab_limit: int | None = None):
    """SDAR's block decoder (``reference.sdar.block_generate``), the authors' forwards and NFE; ``model``:
    an ``SDARReference`` holding the checkpoint's mask and EOS ids."""
    from ..reference.sdar import block_generate

    assert model.mask_id is not None and model.eos_id is not None
    canvas, stats = block_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        block_length=o.block_length,
        steps=o.steps,
        unmasking=o.unmasking or "dynamic",
        threshold=float("inf") if o.threshold is None else o.threshold,
        entropy_bound=o.entropy_bound,
        eos_id=model.eos_id,
        mask_id=model.mask_id,
    )
    return canvas, stats["nfe"]


# family -> reference entry
REFERENCE = {"llada2": llada2_reference, "sdar": sdar_reference}


PLOT_COLOR = "tab:purple"
BLOCKS_ALIGNED_AT_ZERO = True  # LLaDA2's blocks start at 0: block_length need not divide gen_length
STEPS_WITH_CONFIDENCE = True  # its steps bound each block's threshold rule (LLaDA2's own schedule)


def unit_sizes(values: dict) -> list:
    """One block length (the canvas is rounded up to whole blocks)."""
    from ..contract import DEFAULTS

    return [values.get("block_length", DEFAULTS["block_length"])]
