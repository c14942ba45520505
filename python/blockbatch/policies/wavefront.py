"""Policy ``wavefront``: FlowBlock's gated wavefront decoding (docs/ALGORITHMS.md 15) on block-causal
checkpoints with token editing (LLaDA2.1): up to ``max_active_blocks`` blocks in flight, one forward a step
over all of them, the drafts after the oldest block repaired by editing; a block enters when the youngest
is ``spawn_threshold`` decoded."""

from __future__ import annotations

from ._common import fmt, tokens_per_forward

NAME = "wavefront"
MULTI_BRANCH = False
OPTION_GROUP_HELP = "wavefront (FlowBlock's gated wavefront; LLaDA2 checkpoints, with edit_threshold)"
TUNE_AXES = ("max_active_blocks", "spawn_thresholds", "thresholds")


def bench_options(gen_length: int) -> dict:
    """LLaDA2.1's settings (block 32, threshold 0.7, edit_threshold 0.5) with two blocks in flight, a block
    entering once the youngest is half decoded."""
    return dict(
        policy=NAME, block_length=32, threshold=0.7, edit_threshold=0.5, max_active_blocks=2, spawn_threshold=0.5
    )


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    """max_active_blocks x spawn_threshold x threshold at LLaDA2.1's block 32 and edit_threshold 0.5; two
    blocks, gate 0.5, threshold 0.7 first (max_active_blocks 1 once: the gate is not read)."""
    rows = []
    for n in grid.max_active_blocks:
        for gate in grid.spawn_thresholds if n > 1 else grid.spawn_thresholds[:1]:
            for t in grid.thresholds:
                spec = f"{NAME}:block_length=32,edit_threshold=0.5,threshold={fmt(t)},max_active_blocks={n}"
                spec += f",spawn_threshold={fmt(gate)}"
                rows.append((abs(t - 0.7) + abs(n - 2) / 8 + abs(gate - 0.5) / 4, spec))
    return rows


def summary(stats: dict) -> str:
    """Forwards, the mean window, edits and re-drafted tokens."""
    nfe = stats["nfe"]
    window = stats["blocks_in_flight"] / nfe if nfe else 0.0
    return (
        f"[wavefront {stats['branches'][0]['block_size']}] nfe={nfe}, {window:.2f} blocks/forward "
        f"(max {stats['max_blocks_in_flight']}), {tokens_per_forward(stats):.2f} tokens/forward, "
        f"{stats['edits']} edits ({stats['redrafted_tokens']} re-drafted), {stats['wall_ms']:.1f} ms"
    )


def llada2_reference(model, prompt, o, vocab_limit: int | None = None):
    """The wavefront over LLaDA2's exact block cache (``reference.wavefront.wavefront_generate``)."""
    from ..reference.wavefront import reference_entry

    return reference_entry(model, prompt, o, vocab_limit)


# family -> reference entry
REFERENCE = {"llada2": llada2_reference}

PLOT_COLOR = "tab:pink"
BLOCKS_ALIGNED_AT_ZERO = True  # blocks start at 0, as the block policy's
STEPS_WITH_CONFIDENCE = True  # steps is checked as the block policy's (its editing rule commits by confidence)


def unit_sizes(values: dict) -> list:
    """One block length (the canvas is rounded up to whole blocks)."""
    from ..contract import DEFAULTS

    return [values.get("block_length", DEFAULTS["block_length"])]
