"""Random mid-decode BlockBatch state tables for the bookkeeping ops (bb_absorb_, bb_coordinate_):
benchmarks/bench_gpu_step.py times the ops on them, and the tests check the ops against them."""

from __future__ import annotations

import torch

# Columns of the BlockBatch state table (csrc/kernels/branches.h, enum Field).
BRANCH_FIELDS = (
    "block",
    "start",
    "end",
    "decoded",
    "done",
    "since_refresh",
    "needs_refresh",
    "eos_ready",
    "masks",
    "committed",
    "merged",
    "copied",
    "frontier",
)
FIELD = {name: i for i, name in enumerate(BRANCH_FIELDS)}


def random_branch_state(
    seed: int,
    *,
    prompt_len: int = 3,
    gen_length: int = 64,
    sizes=(4, 8, 16, 32),
    vocab: int = 8,
    mask_id: int = 9,
    k: int = 3,
) -> dict:
    """A plausible mid-decode BlockBatch state for the bookkeeping ops (bb_absorb_, bb_coordinate_).

    Every branch holds a noisy copy of one hidden answer: a decoded prefix, scattered tokens
    after it, sometimes a token that clashes with the answer; its window is the block of its first
    mask, or (half the time) the complete block before it, which coordinate must advance. The
    probability maps favour the answer's tokens, so merges pass the gate; `decoded` counts are
    spread widely, so syncs fire. Tensors are on the CPU (int64 / float64).
    """
    g = torch.Generator().manual_seed(seed)
    rand = lambda: float(torch.rand((), generator=g))  # noqa: E731
    B, G, lp = len(sizes), gen_length, prompt_len
    L = lp + G
    answer = torch.randint(0, vocab, (G,), generator=g)
    canvas = torch.full((B, L), mask_id, dtype=torch.long)
    canvas[:, :lp] = torch.randint(0, vocab, (lp,), generator=g)
    state = torch.zeros(B, len(BRANCH_FIELDS), dtype=torch.long)
    for b, size in enumerate(sizes):
        upto = int(torch.randint(0, G + 1, (1,), generator=g)) if rand() < 0.9 else G
        keep = (torch.arange(G) < upto) | (torch.rand(G, generator=g) < 0.25)
        row = answer.clone()
        if rand() < 0.3:  # one clash with the other branches
            p = int(torch.randint(0, G, (1,), generator=g))
            row[p] = (row[p] + 1) % vocab
        canvas[b, lp:] = torch.where(keep, row, torch.tensor(mask_id))
        masks = (canvas[b, lp:] == mask_id).nonzero()
        st = state[b]
        st[FIELD["block"]] = size
        if len(masks) == 0:
            st[FIELD["done"]], st[FIELD["start"]], st[FIELD["end"]] = 1, L, L
        else:
            start = lp + int(masks[0]) // size * size
            if start > lp and rand() < 0.5:
                start -= size  # a complete window: coordinate advances it
            st[FIELD["start"]], st[FIELD["end"]] = start, start + size
            st[FIELD["masks"]] = int((canvas[b, start : start + size] == mask_id).sum())
        st[FIELD["decoded"]] = int(torch.randint(0, G + 1, (1,), generator=g))
        st[FIELD["since_refresh"]] = int(torch.randint(0, 3, (1,), generator=g))
        st[FIELD["needs_refresh"]] = int(rand() < 0.2)
        for name in ("committed", "merged", "copied"):
            st[FIELD[name]] = int(torch.randint(0, 20, (1,), generator=g))
    map_ids = torch.full((B, G, k), -1, dtype=torch.long)
    map_probs = torch.zeros(B, G, k, dtype=torch.float64)
    for b in range(B):
        for p in range(G):
            if rand() < 0.2:
                continue  # never recorded
            slot = int(torch.randint(0, k, (1,), generator=g))  # ids sit anywhere in the entry
            p_answer = 0.3 + 0.7 * rand()
            map_ids[b, p, slot], map_probs[b, p, slot] = answer[p], p_answer
            if rand() < 0.5:
                other = (slot + 1) % k
                map_ids[b, p, other] = (answer[p] + 1) % vocab
                map_probs[b, p, other] = (1 - p_answer) * rand()
    return dict(
        canvas=canvas,
        state=state,
        eos_prob=torch.zeros(B, dtype=torch.float64),
        map_ids=map_ids,
        map_probs=map_probs,
        flags=torch.zeros(2, dtype=torch.long),
        sync_src=torch.full((B,), -1, dtype=torch.long),
        prompt_len=lp,
        mask_id=mask_id,
    )


def coordinate_args(
    s: dict, *, merge_gate=0.5, merge=True, sync=True, sync_gap=8, refresh_tokens=32, periodic_refresh=True
) -> tuple:
    """bb_coordinate_'s arguments for a random_branch_state dict."""
    return (
        s["canvas"],
        s["state"],
        s["eos_prob"],
        s["flags"],
        s["sync_src"],
        s["map_ids"],
        s["map_probs"],
        s["prompt_len"],
        s["mask_id"],
        merge_gate,
        merge,
        sync,
        sync_gap,
        refresh_tokens,
        periodic_refresh,
    )


def window_spans(state: torch.Tensor, full: int = 0) -> tuple[list, int]:
    """bb_absorb_ spans for a block step over every live branch's window, packed in branch order:
    ([[branch, logits_row, start, rows, full], ...], total logits rows)."""
    spans, rows = [], 0
    for b in range(state.shape[0]):
        if not state[b, FIELD["done"]]:
            start, end = int(state[b, FIELD["start"]]), int(state[b, FIELD["end"]])
            spans.append([b, rows, start, end - start, full])
            rows += end - start
    return spans, rows
