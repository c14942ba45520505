"""Policy ``blockbatch``: several branches of different block sizes decode one request side by side,
merging and synchronising through a shared probability map (docs/ALGORITHMS.md 4; Dream's rules 5.4)."""

from __future__ import annotations

from ._common import dream_reference, fmt

NAME = "blockbatch"
MULTI_BRANCH = True
OPTION_GROUP_HELP = "blockbatch (policy blockbatch only)"
TUNE_AXES = ("branch_sets", "thresholds", "merge_gates", "eos_exit", "refresh", "sync_refresh")


def bench_options(gen_length: int) -> dict:
    """Threshold 0.9; the branches are the family's default block sizes that divide gen_length."""
    return dict(policy=NAME, threshold=0.9)


def tune_rows(grid, gen_length: int) -> list[tuple[float, str]]:
    """Each branch set (cut to the sizes that divide gen_length, duplicates once) x threshold x
    merge gate x EOS exit x refresh x sync refresh; the paper's settings (0.9, gate 0.5, EOS exit,
    refresh 32, no sync refresh) and the earlier branch sets first."""
    rows: list[tuple[float, str]] = []
    seen = set()
    for sizes in grid.branch_sets:
        kept = tuple(b for b in sizes if gen_length % b == 0 and b <= gen_length)
        if not kept or kept in seen:
            continue
        seen.add(kept)
        for t in grid.thresholds:
            for g in grid.merge_gates:
                for eos in grid.eos_exit:
                    for r in grid.refresh:
                        refresh = min(kept) if r == "block" else int(r)
                        if r == "block" and refresh == 32 and "32" in grid.refresh:
                            continue
                        for sr in grid.sync_refresh:
                            spec = (
                                f"blockbatch:block_sizes={'/'.join(map(str, kept))},threshold={fmt(t)},"
                                f"merge_gate={fmt(g)},refresh_tokens={refresh}"
                            )
                            if not eos:
                                spec += ",stop_on_eos=false"
                            if sr:
                                spec += ",sync_refresh=true"
                            rank = (
                                abs(t - 0.9)
                                + abs(g - 0.5) / 4
                                + (0 if eos else 0.05)
                                + (0 if refresh == 32 else 0.02)
                                + len(seen) * 0.01
                                + (0.005 if sr else 0)
                            )
                            rows.append((rank, spec))
    return rows


def summary(stats: dict) -> str:
    branches = stats["branches"]
    return (
        f"[blockbatch {','.join(str(b['block_size']) for b in branches)}] nfe={stats['nfe']} "
        f"(init {stats['nfe_init']} + block {stats['nfe_block']} + refresh {stats['nfe_refresh']}), "
        f"paper NFE {stats['nfe_paper']}, winner block {stats['winner_block_size']}"
        f"{' (EOS exit)' if stats['early_exit'] else ''}, merged {sum(b['merged'] for b in branches)}, "
        f"synced {sum(b['copied'] for b in branches)} tokens, {stats['wall_ms']:.1f} ms"
    )


def llada_reference(model, prompt, o, vocab_limit: int | None = None):
    """LLaDA's BlockBatch reference (``reference.blockbatch``; its row cut at EOS continues with EOS)."""
    r = llada_reference_result(model, prompt, o)
    return r.tokens, r.nfe


def llada_reference_result(model, prompt, o, commit_rows: bool = False):
    """``llada_reference``'s whole ``BlockBatchResult`` (``commit_rows``: with the winner's commit rows)."""
    from ..reference.blockbatch import blockbatch_generate

    assert o.threshold is not None  # DecodeOptions refuses blockbatch without a threshold
    family = "llada"
    r = blockbatch_generate(
        model,
        prompt,
        o.gen_length,
        o.resolved("block_sizes", family),
        threshold=o.threshold,
        merge_gate=o.merge_gate,
        sync_gap=o.sync_gap,
        refresh_tokens=o.refresh_tokens,
        refresh_mode=o.refresh_mode,
        prob_floor=o.resolved("prob_floor", family),
        stop_on_eos=o.eos_exit,
        merge=o.merge,
        sync=o.sync,
        temperature=o.temperature,
        seed=o.seed,
        sync_refresh=o.sync_refresh,
        fold_rows=o.fold_rows,
        share_prompt_kv=o.share_prompt_kv,
        commit_rows=commit_rows,
    )
    return r


# family -> reference entry
REFERENCE = {"llada": llada_reference, "dream": dream_reference}


PLOT_COLOR = "tab:red"
BLOCKS_ALIGNED_AT_ZERO = False
STEPS_WITH_CONFIDENCE = False


def unit_sizes(values: dict) -> list | None:
    """Every branch size (None: the model family's default branch set)."""
    return values.get("block_sizes") or None
