"""Random LLaDA checkpoints of any shape, in the exact HF layout (used by tests and benchmarks)."""

from __future__ import annotations

import os

import torch

from .config import ModelConfig
from .loading import expected_weight_shapes, save_checkpoint


def random_config(**overrides) -> ModelConfig:
    """A small valid LLaDA config; any field can be overridden."""
    fields = dict(
        d_model=64, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden_size=128, vocab_size=97,
        embedding_size=None, rope_theta=10000.0, rms_norm_eps=1e-5, weight_tying=False,
        mask_token_id=None, eos_token_id=None, max_sequence_length=1024,
    )
    fields.update(overrides)
    if fields["embedding_size"] is None:
        fields["embedding_size"] = fields["vocab_size"]
    if fields["mask_token_id"] is None:
        fields["mask_token_id"] = fields["vocab_size"] - 1
    if fields["eos_token_id"] is None:
        fields["eos_token_id"] = fields["vocab_size"] - 2
    fields.setdefault("pad_token_id", fields["eos_token_id"])
    return ModelConfig(**fields).validate()


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                   logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in); norms near 1.

    ``logit_scale`` multiplies the LM head so that tests can make the model more or less
    confident (a larger scale gives peaked softmaxes, so threshold rules commit several tokens).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in expected_weight_shapes(config).items():
        if len(shape) == 1:  # norm weights
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("wte.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name.endswith("transformer.ff_out.weight"):
                t = t * logit_scale
        weights[name] = t.to(dtype)
    return weights


def make_random_checkpoint(path: str | os.PathLike, seed: int = 0, dtype: torch.dtype = torch.float32,
                           logit_scale: float = 1.0, max_shard_bytes: int | None = None,
                           tokenizer=None, **config_overrides) -> ModelConfig:
    """Write a random checkpoint folder at ``path`` and return its config."""
    config = random_config(**config_overrides)
    save_checkpoint(path, config, random_weights(config, seed, dtype, logit_scale), tokenizer=tokenizer,
                    max_shard_bytes=max_shard_bytes)
    return config


# Columns of the BlockBatch state table (csrc/kernels/branches.h, enum Field).
BRANCH_FIELDS = ("block", "start", "end", "decoded", "done", "since_refresh", "needs_refresh", "eos_ready", "masks",
                 "committed", "merged", "copied")
FIELD = {name: i for i, name in enumerate(BRANCH_FIELDS)}


def random_branch_state(seed: int, *, prompt_len: int = 3, gen_length: int = 64, sizes=(4, 8, 16, 32),
                        vocab: int = 8, mask_id: int = 9, k: int = 3) -> dict:
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
            st[FIELD["masks"]] = int((canvas[b, start:start + size] == mask_id).sum())
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
    return dict(canvas=canvas, state=state, eos_prob=torch.zeros(B, dtype=torch.float64), map_ids=map_ids,
                map_probs=map_probs, flags=torch.zeros(2, dtype=torch.long),
                sync_src=torch.full((B,), -1, dtype=torch.long), prompt_len=lp, mask_id=mask_id)


def coordinate_args(s: dict, *, merge_gate=0.5, merge=True, sync=True, sync_gap=8, refresh_tokens=32,
                    periodic_refresh=True) -> tuple:
    """bb_coordinate_'s arguments for a random_branch_state dict."""
    return (s["canvas"], s["state"], s["eos_prob"], s["flags"], s["sync_src"], s["map_ids"], s["map_probs"],
            s["prompt_len"], s["mask_id"], merge_gate, merge, sync, sync_gap, refresh_tokens, periodic_refresh)


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


def commit_case(g: torch.Generator, n: int) -> tuple:
    """A commit_ case over a window of n positions of a canvas of n + 50 (mask id 9, 60% masked,
    a fifth of the confidences tied at 0.5): (canvas, window, token, conf, k)."""
    L = n + 50
    canvas = torch.randint(0, 6, (L,), generator=g)
    canvas[torch.rand(L, generator=g) < 0.6] = 9
    window = torch.randperm(L, generator=g)[:n]
    token = torch.randint(0, 9, (n,), generator=g)
    conf = torch.rand(n, generator=g, dtype=torch.float64)
    conf[torch.rand(n, generator=g) < 0.2] = 0.5
    return canvas, window, token, conf, torch.tensor([n // 3])


def absorb_case(seed: int, dtype: torch.dtype, eos: int):
    """A bb_absorb_ case: random_branch_state(seed), the spans of a block step over its live
    branches, logits for them (vocab 300, `eos` favoured) and their confidence / sparse
    probabilities from the CPU ops: (state, spans, logits, token, conf, ids, probs), or None when
    no branch is live."""
    state = random_branch_state(seed)
    g = torch.Generator().manual_seed(seed)
    spans, rows = window_spans(state["state"], full=seed % 2)
    if not spans:
        return None
    logits = (torch.randn(rows, 300, generator=g) * 4).to(dtype)
    logits[:, eos] += 3
    token, conf = torch.ops.blockbatch.confidence(logits, state["mask_id"])
    ids, probs = torch.ops.blockbatch.sparse_probs(logits, 0.1, 3)
    return state, spans, logits, token, conf, ids, probs


def rope_table(max_pos: int, hd: int, theta: float) -> torch.Tensor:
    """The model's RoPE table (cos | sin per position, float32) from the reference's angles."""
    from .reference.model import rope_cos_sin

    cos, sin = rope_cos_sin(torch.arange(max_pos), hd, theta)
    return torch.cat([cos[:, : hd // 2], sin[:, : hd // 2]], dim=1).contiguous()


def rope_kv_case(device="cpu", dtype=torch.float32, heads=4, kv_heads=2, hd=16):
    """A fused qkv GEMM output with q / k / v head views, as the model slices it, and a KV buffer."""
    g = torch.Generator().manual_seed(5)
    T = 9
    qkv = torch.randn(T, (heads + 2 * kv_heads) * hd, generator=g).to(device, dtype)
    q = qkv[:, : heads * hd].view(T, heads, hd)
    k = qkv[:, heads * hd:(heads + kv_heads) * hd].view(T, kv_heads, hd)
    v = qkv[:, (heads + kv_heads) * hd:].view(T, kv_heads, hd)
    kv = torch.randn(3, 2, 2, kv_heads, 20, hd, generator=g).to(device, dtype)
    index = [torch.tensor(x, device=device) for x in ([3, 4, 19, 0, 9, 8, 1, 2, 7], [0, 2, 5, 9], [2, 0, 1])]
    return qkv, q, k, v, kv, index
