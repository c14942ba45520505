"""Op test cases shared by the CPU op tests, the CPU CUDA-emulator tests and the GPU tests: the
same inputs, so the three compare like with like."""

from __future__ import annotations

import torch

import blockbatch  # noqa: F401  (registers torch.ops.blockbatch)
from helpers.random_branch_state import random_branch_state, window_spans


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
    from blockbatch.reference.model import rope_cos_sin

    cos, sin = rope_cos_sin(torch.arange(max_pos), hd, theta)
    return torch.cat([cos[:, : hd // 2], sin[:, : hd // 2]], dim=1).contiguous()


def rope_kv_case(device="cpu", dtype=torch.float32, heads=4, kv_heads=2, hd=16):
    """A fused qkv GEMM output with q / k / v head views, as the model slices it, and a KV buffer."""
    g = torch.Generator().manual_seed(5)
    T = 9
    qkv = torch.randn(T, (heads + 2 * kv_heads) * hd, generator=g).to(device, dtype)
    q = qkv[:, : heads * hd].view(T, heads, hd)
    k = qkv[:, heads * hd : (heads + kv_heads) * hd].view(T, kv_heads, hd)
    v = qkv[:, (heads + kv_heads) * hd :].view(T, kv_heads, hd)
    kv = torch.randn(3, 2, 2, kv_heads, 20, hd, generator=g).to(device, dtype)
    index = [torch.tensor(x, device=device) for x in ([3, 4, 19, 0, 9, 8, 1, 2, 7], [0, 2, 5, 9], [2, 0, 1])]
    return qkv, q, k, v, kv, index
