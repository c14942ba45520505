"""Policy ``window``: Window-Diffusion (docs/ALGORITHMS.md 13): phases of one full forward then pruned
forwards that compute a few active positions over a gathered key window (the decoded positions and
the first masks)."""

from __future__ import annotations

from ._common import tokens_per_forward

NAME = "window"
MULTI_BRANCH = False
OPTION_GROUP_HELP = "Window-Diffusion (policy window)"
TUNE_AXES = ("refresh_intervals", "active_tokens", "window_tokens")


def bench_options(gen_length: int) -> dict:
    """The authors' benchmark settings (their scripts/run_benchmarks.sh): one token per step, active 16,
    a full forward every 32 steps, the family's window (LLaDA 64; Dream 127 masks, their o_win_size 128,
    with its sliding span)."""
    return dict(policy=NAME, threshold=None, steps=gen_length, active_tokens=16, refresh_interval=32)


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    """refresh_interval x active_tokens x window_tokens at one token per step, the authors' 32 / 16 / 64
    first."""
    rows = []
    for r in grid.refresh_intervals:
        for a in grid.active_tokens:
            for w in grid.window_tokens:
                rank = abs(r - 32) / 32 + abs(a - 16) / 16 + abs(w - 64) / 64
                spec = f"{NAME}:steps={gen_length},refresh_interval={r},active_tokens={a},window_tokens={w}"
                rows.append((rank, spec))
    return rows


def summary(stats: dict) -> str:
    """Full and pruned forwards, the mean keys a pruned step attended."""
    pruned = stats["nfe_pruned"]
    keys = stats["pruned_key_tokens"] / pruned if pruned else 0.0
    queries = sum(stats["query_tokens_per_step"]) / stats["nfe"] if stats["nfe"] else 0.0
    return (
        f"[window] nfe={stats['nfe']} (full {stats['nfe_full']} + pruned {pruned}), "
        f"{queries:.1f} queries/forward, {keys:.1f} keys/pruned forward, "
        f"{tokens_per_forward(stats):.2f} tokens/forward, {stats['wall_ms']:.1f} ms"
    )


def llada_reference(model, prompt, o, vocab_limit: int | None = None):
    """Window-Diffusion's LLaDA decoder (``reference.window.window_generate``)."""
    from ..reference.window import reference_entry

    return reference_entry(model, prompt, o, vocab_limit)


def dream_reference(model, prompt, o, vocab_limit: int | None = None):
    """Window-Diffusion's Dream decoder (``reference.window.dream_window_generate``)."""
    from ..reference.window import dream_reference_entry

    return dream_reference_entry(model, prompt, o, vocab_limit)


# family -> reference entry
REFERENCE = {"llada": llada_reference, "dream": dream_reference}

PLOT_COLOR = "tab:olive"
BLOCKS_ALIGNED_AT_ZERO = False
STEPS_WITH_CONFIDENCE = False


def unit_sizes(values: dict) -> list:
    """No blocks: any gen_length."""
    return [1]
