"""SDAR (``model_type`` "sdar", ``SDARForCausalLM``: SDAR-1.7B/4B/8B-Chat; TraDo shares its body) in plain
PyTorch, written from the spec to be read: the oracle for a native SDAR forward and for the ``block``
policy's SDAR rules.

The model: a Qwen3 body. ``embed_tokens``; per layer ``h += attn(RMSNorm(h))``, ``h += mlp(RMSNorm(h))``;
a final RMSNorm and an untied ``lm_head`` (tied when ``tie_word_embeddings``). Output ``i`` predicts
token ``i`` (no shift). All norms compute in float32.

* Attention: separate ``q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj`` without biases, ``num_attention_heads``
  query heads and ``num_key_value_heads`` KV heads of ``head_dim`` (GQA: query head ``h`` reads KV head
  ``h // (H // Hkv)``); a per-head RMSNorm on q and on k (``q_norm`` / ``k_norm``, weights of ``head_dim``)
  **before** RoPE; RoPE on the whole head (rotate-half pairing: dim ``i`` with ``i + head_dim / 2``), its
  angles float32 products of float32 inverse frequencies ``theta ** -(arange(0, head_dim, 2) / head_dim)``
  and positions (the authors' rotary embedding); scale ``head_dim ** -0.5``, softmax in float32.
* Block-causal attention: blocks of ``block_length`` aligned at position 0; a query sees its own block and
  every earlier one. So a block's K/V depend only on the tokens up to its end.
* MLP: ``down(silu(gate(x)) * up(x))``.

The decoder (``block_generate``): the authors' ``generate.py`` ``block_diffusion_generate`` with the
greedy proposal of their evaluation harness (the argmax and its unfiltered float32 softmax probability),
see ``docs/sdar.md``. Every forward is one of three kinds, all counted in the NFE: the prefill of the
prompt's complete blocks, a block's denoising forwards (its queries against the cache), and the store
forward of a block once it holds no mask (its final K/V written to the cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from .model import rms_norm, rotate_half  # the same arithmetic as the other references

MODEL_TYPE = "sdar"
PREFIX = "model."
UNMASKING = ("dynamic", "static", "sequential", "entropy_bounded")
ENTROPY_FLOOR = 1e-12  # q = max(p, 1e-12) in the entropy_bounded rule


@dataclasses.dataclass(frozen=True)
class SDARConfig:
    """The keys of an SDAR ``config.json`` the forward reads (Hugging Face names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SDARConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields and v is not None}
        values.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
        values.setdefault("num_key_value_heads", raw["num_attention_heads"])
        return cls(**values)


def weight_shapes(cfg: SDARConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of an SDAR checkpoint, with its shape (Hugging Face names)."""
    d, hd, H, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    shapes: dict[str, tuple[int, ...]] = {PREFIX + "embed_tokens.weight": (cfg.vocab_size, d)}
    for i in range(cfg.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "self_attn.q_proj.weight"] = (H * hd, d)
        shapes[p + "self_attn.k_proj.weight"] = (Hkv * hd, d)
        shapes[p + "self_attn.v_proj.weight"] = (Hkv * hd, d)
        shapes[p + "self_attn.q_norm.weight"] = (hd,)
        shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "self_attn.o_proj.weight"] = (d, H * hd)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, d)
        shapes[p + "mlp.down_proj.weight"] = (d, cfg.intermediate_size)
    shapes[PREFIX + "norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    return shapes


def random_weights(cfg: SDARConfig, seed: int = 0, logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in), norms near 1; ``logit_scale`` multiplies the LM head."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name == "lm_head.weight":
                t = t * logit_scale
        out[name] = t.float()
    return out


def rope_cos_sin(length: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin ``[length, head_dim]`` (rotate-half layout), float32 as the authors' rotary embedding."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer K and V [Hkv, positions, head_dim], after norm and RoPE


class SDARReference:
    """The float32 forward of an SDAR checkpoint's weights (Hugging Face names); ``mask_id`` /
    ``eos_id``: the checkpoint's special ids, kept for the decoder."""

    def __init__(
        self, cfg: SDARConfig, weights: dict[str, torch.Tensor], mask_id: int | None = None, eos_id: int | None = None
    ):
        self.cfg = cfg
        self.w = {k: v.float() for k, v in weights.items()}
        self.mask_id, self.eos_id = mask_id, eos_id

    def forward(self, ids: torch.Tensor, block_length: int | None) -> torch.Tensor:
        """Logits ``[len(ids), vocab]`` of the canvas at positions ``0..len-1``, block-causal with blocks
        of ``block_length`` (None: every position sees every other)."""
        n = ids.shape[0]
        if block_length is None:
            visible = torch.ones(n, n, dtype=torch.bool)
        else:
            block = torch.arange(n) // block_length
            visible = block[None, :] <= block[:, None]
        return self.forward_window(ids, 0, None, visible)[0]

    def forward_window(
        self, ids: torch.Tensor, start: int, cache: KV | None, visible: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, KV]:
        """The logits of the tokens ``ids`` at positions ``start..``, attending to the ``cache`` (the K/V of
        positions ``0..start-1``) and to each other (``visible[q, k]`` over the window's own keys; None:
        all of them, as within one block); returns the logits and the window's own K/V per layer."""
        cfg, w = self.cfg, self.w
        n, hd, H, Hkv = ids.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        cos, sin = rope_cos_sin(start + n, hd, cfg.rope_theta)
        cos, sin = cos[start:], sin[start:]
        h = w[PREFIX + "embed_tokens.weight"][ids]
        own: KV = []
        for i in range(cfg.num_hidden_layers):
            p = f"{PREFIX}layers.{i}."
            x = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(n, H, hd).transpose(0, 1)
            k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(n, Hkv, hd).transpose(0, 1)
            v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(n, Hkv, hd).transpose(0, 1)
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            own.append((k, v))
            if cache is not None:
                k, v = torch.cat([cache[i][0], k], dim=1), torch.cat([cache[i][1], v], dim=1)
            k, v = k.repeat_interleave(H // Hkv, dim=0), v.repeat_interleave(H // Hkv, dim=0)
            scores = torch.matmul(q, k.transpose(1, 2)) * hd**-0.5
            if visible is not None:
                allowed = torch.cat([torch.ones(n, start, dtype=torch.bool), visible], dim=1)
                scores = scores.masked_fill(~allowed, float("-inf"))
            attn = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), v)
            h = h + F.linear(attn.transpose(0, 1).reshape(n, H * hd), w[p + "self_attn.o_proj.weight"])
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            mlp = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"])
            h = h + F.linear(mlp, w[p + "mlp.down_proj.weight"])
        h = rms_norm(h, w[PREFIX + "norm.weight"], cfg.rms_norm_eps)
        head = w[PREFIX + "embed_tokens.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
        return F.linear(h, head), own


def schedule(block_length: int, steps: int) -> list[int]:
    """The commits of a block's ``steps`` steps: ``block_length // steps`` each, one more for the first
    ``block_length % steps``."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def top(confidence: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` most confident positions of the block, in ``torch.topk``'s CPU order: the tie rule
    (docs/sdar.md). The confidence is -inf off the masks, so a count above the masks left also takes
    positions already decided (they are rewritten with their current argmax, as in the authors' code)."""
    return torch.topk(confidence, count).indices


def commit_positions(
    rule: str,
    masked: torch.Tensor,
    p: torch.Tensor,
    count: int | None,
    threshold: float,
    entropy_bound: float,
) -> torch.Tensor:
    """The positions of the block a step writes its proposals to (``masked``: the block's masks;
    ``p``: the proposals' float32 probabilities; ``count``: the schedule's n for this step)."""
    confidence = torch.where(masked, p, torch.tensor(float("-inf")))
    chosen = torch.zeros_like(masked)
    if rule == "dynamic":
        high = confidence > torch.tensor(threshold, dtype=torch.float32)
        assert count is not None
        if int(high.sum()) >= count:
            return high
        chosen[top(confidence, count)] = True
    elif rule == "static":
        assert count is not None
        chosen[top(confidence, count)] = True
    elif rule == "sequential":
        assert count is not None
        first = int(masked.nonzero()[0])
        chosen[first : first + count] = True
    elif rule == "entropy_bounded":
        q = p.clamp_min(ENTROPY_FLOOR)
        entropy = -(q * q.log()).sum()  # one number for the whole block
        sums = torch.cumsum(torch.where(masked, entropy, torch.tensor(float("inf"))).sort().values, 0)
        below = int((sums < torch.tensor(entropy_bound, dtype=torch.float32)).sum())
        k = max(1, min(below, int(masked.sum())))
        chosen[masked.nonzero()[:k, 0]] = True  # the k leftmost masks
    else:
        raise ValueError(f"unmasking must be one of {', '.join(UNMASKING)}, got {rule!r}")
    return chosen


def block_generate(
    model: SDARReference,
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int = 4,
    steps: int | None = None,
    unmasking: str = "dynamic",
    threshold: float = 0.85,
    entropy_bound: float = 0.35,
    mask_id: int,
    eos_id: int,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """SDAR's block decoder, greedy. Returns the canvas (prompt + ``gen_length`` positions) and stats:
    ``nfe`` (every forward: prefill + denoising + store), ``nfe_prefill``, ``nfe_denoise``, ``nfe_store``,
    ``forwards_per_block`` (denoising forwards of each decoded block)."""
    P, B = prompt.numel(), block_length
    steps = B if steps is None else steps
    n = schedule(B, steps)
    blocks = (P + gen_length + B - 1) // B
    x = torch.full((blocks * B,), mask_id, dtype=torch.long)
    x[:P] = prompt
    counts = {"prefill": 0, "denoise": 0, "store": 0}
    per_block: list[int] = []
    cache: KV | None = None

    def store(kv: KV) -> None:
        nonlocal cache
        cache = (
            kv if cache is None else [(torch.cat([a, k], 1), torch.cat([b, v], 1)) for (a, b), (k, v) in zip(cache, kv)]
        )

    first = P // B
    if first > 0:  # prefill: the prompt's complete blocks, block-causal
        counts["prefill"] += 1
        block = torch.arange(first * B) // B
        store(model.forward_window(x[: first * B], 0, None, block[None, :] <= block[:, None])[1])
    for b in range(first, blocks):
        s, e = b * B, (b + 1) * B
        before = counts["denoise"]
        for step in range(steps + 1):
            masked = x[s:e] == mask_id
            if not masked.any():
                counts["store"] += 1
                store(model.forward_window(x[s:e], s, cache)[1])
                break
            counts["denoise"] += 1
            logits = model.forward_window(x[s:e], s, cache)[0].float()
            x0 = logits.argmax(-1)
            p = F.softmax(logits, dim=-1).gather(-1, x0[:, None])[:, 0]
            chosen = commit_positions(unmasking, masked, p, n[step] if step < steps else None, threshold, entropy_bound)
            x[s:e][chosen] = x0[chosen]
        per_block.append(counts["denoise"] - before)
        if (x[P:e] == eos_id).any():
            break
    stats = {
        "nfe": sum(counts.values()),
        "nfe_prefill": counts["prefill"],
        "nfe_denoise": counts["denoise"],
        "nfe_store": counts["store"],
        "forwards_per_block": per_block,
    }
    return x[: P + gen_length].clone(), stats


def generated_text_ids(canvas: torch.Tensor, prompt_length: int, eos_id: int) -> list[int]:
    """The generation as the authors' callers cut it: up to and including the first EOS after the prompt."""
    gen = canvas[prompt_length:].tolist()
    return gen[: gen.index(eos_id) + 1] if eos_id in gen else gen
