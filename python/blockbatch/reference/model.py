"""A LLaDA transformer in plain PyTorch, written to be read: the oracle for the native forward.

Architecture (LLaDA-8B, ``block_type`` llama): pre-norm blocks,

    h = x + attn_out(Attention(RoPE(q_proj(n1)), RoPE(k_proj(n1)), v_proj(n1))),  n1 = attn_norm(x)
    y = h + ff_out(silu(ff_proj(n2)) * up_proj(n2)),                              n2 = ff_norm(h)

then ``ln_f`` and the LM head (``ff_out``, or ``wte`` when weights are tied). Logits are NOT
shifted: output ``i`` predicts the token at position ``i``.

A Dream checkpoint (Qwen2 body, ``config.family == "dream"``) runs through the same code: its
weights are renamed onto the LLaDA slots (``DREAM_NAMES``) and its q/k/v projections add their
biases (``x @ W.T + b``). The forward stays unshifted; Dream's shift (position ``i`` read from
output ``i - 1``) belongs to the decoders in ``reference/dream.py``. Attention is bidirectional with no
mask, scale ``1/sqrt(head_dim)``; with GQA, query head ``h`` reads kv head
``h // (n_heads // n_kv_heads)``.

KV rows. A KV buffer has shape ``[rows, layers, 2, kv_heads, L, head_dim]`` (2 = key, value;
keys stored after RoPE). ``forward`` takes, per row, query ids and their absolute positions:

* ``"full"``: the queries attend to themselves only (the whole canvas); when a buffer is
  given their K/V are written to the slots of their positions.
* ``"dual"``: the queries' K/V overwrite their own slots first, then attention runs over all
  ``L`` keys of that row (Fast-dLLM dual cache), or over the positions ``key_positions[r]`` of
  that row when given (a gathered key set: Window-Diffusion's window).
* ``"prefix"``: attention over the row's cached keys ``[0, s)`` followed by the queries' own
  K/V; nothing is written (Fast-dLLM prefix cache).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..families.llada import PREFIX

MODES = ("full", "dual", "prefix")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps)`` in float32, cast back to x's dtype, then times weight."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[n, head_dim]`` (rotate-half layout), angles computed in float64."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: ``[n, heads, head_dim]``; rotation applied in float32 at the given positions."""
    xf = x.float()
    out = xf * cos[:, None, :] + rotate_half(xf) * sin[:, None, :]
    return out.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Bidirectional attention. q ``[nq, H, hd]``, k/v ``[nk, KVH, hd]`` -> ``[nq, H, hd]`` (float32 math)."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


# LLaDA slot -> Dream (Qwen2) tensor name, per layer.
DREAM_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "attn_out": "self_attn.o_proj.weight",
    "ff_norm": "post_attention_layernorm.weight",
    "ff_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "ff_out": "mlp.down_proj.weight",
    "q_bias": "self_attn.q_proj.bias",
    "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
}


def _proj(h: torch.Tensor, w: dict, name: str) -> torch.Tensor:
    """``h @ W.T``, plus the bias when the layer has one (Dream's q/k/v)."""
    out = h @ w[name].T
    bias = w.get(name[0] + "_bias")
    return out if bias is None else out + bias


class ReferenceModel:
    """Readable LLaDA / Dream forward over one or more KV rows (see the module docstring)."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype | None = None):
        self.config = config
        self.dtype = dtype or next(iter(weights.values())).dtype
        w = {k: v.to(self.dtype) for k, v in weights.items()}
        if getattr(config, "family", "llada") == "dream":
            self.wte = w["model.embed_tokens.weight"]
            self.layers = [
                {slot: w[f"model.layers.{i}.{name}"] for slot, name in DREAM_NAMES.items()}
                for i in range(config.n_layers)
            ]
            self.ln_f = w["model.norm.weight"]
            self.lm_head = self.wte if config.weight_tying else w["lm_head.weight"]
            return
        self.wte = w[PREFIX + "wte.weight"]
        self.layers = [
            {
                name: w[f"{PREFIX}blocks.{i}.{name}.weight"]
                for name in (
                    "attn_norm",
                    "q_proj",
                    "k_proj",
                    "v_proj",
                    "attn_out",
                    "ff_norm",
                    "ff_proj",
                    "up_proj",
                    "ff_out",
                )
            }
            for i in range(config.n_layers)
        ]
        self.ln_f = w[PREFIX + "ln_f.weight"]
        self.lm_head = self.wte if config.weight_tying else w[PREFIX + "ff_out.weight"]

    @classmethod
    def from_checkpoint(cls, checkpoint, dtype: torch.dtype | None = None) -> "ReferenceModel":
        return cls(checkpoint.config, checkpoint.weights, dtype)

    def new_kv(self, rows: int, length: int) -> torch.Tensor:
        c = self.config
        return torch.zeros(rows, c.n_layers, 2, c.n_kv_heads, length, c.head_dim, dtype=self.dtype)

    def forward(
        self,
        ids: Sequence[torch.Tensor],
        positions: Sequence[torch.Tensor],
        kv: torch.Tensor | None = None,
        mode: str = "full",
        kv_rows: Sequence[int] | None = None,
        prefix_lens: Sequence[int] | None = None,
        key_positions: Sequence[torch.Tensor] | None = None,
    ) -> list[torch.Tensor]:
        """Logits ``[len(ids[r]), vocab_size]`` (float32) for each query row ``r``.

        ``kv_rows[r]`` picks the buffer row used by query row ``r`` (default ``r``);
        ``prefix_lens[r]`` is ``s`` for mode ``"prefix"``; ``key_positions[r]`` (mode ``"dual"``):
        the positions of its KV row that row ``r`` attends (default: all).
        """
        if key_positions is not None and mode != "dual":
            raise ValueError("key_positions needs mode 'dual'")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode != "full" and kv is None:
            raise ValueError(f"mode {mode!r} needs a KV buffer")
        kv_rows = list(range(len(ids))) if kv_rows is None else list(kv_rows)
        out = []
        for r, (row_ids, row_pos) in enumerate(zip(ids, positions)):
            s = prefix_lens[r] if prefix_lens is not None else 0
            keys = key_positions[r] if key_positions is not None else None
            out.append(self._forward_row(row_ids, row_pos, kv, mode, kv_rows[r], s, keys))
        return out

    def forward_batch(self, ids: torch.Tensor) -> torch.Tensor:
        """Full-canvas logits for a batch of equal-length rows: ids ``[B, L]`` -> ``[B, L, vocab]``.

        Same math as ``forward(mode="full")`` (positions ``0..L-1``), batched for training;
        differentiable when the weights require grad.
        """
        c = self.config
        hd = c.head_dim
        B, L = ids.shape
        cos, sin = rope_cos_sin(torch.arange(L), hd, c.rope_theta)
        x = self.wte[ids]  # [B, L, d]
        for w in self.layers:
            h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
            q = apply_rope(_proj(h, w, "q_proj").view(B * L, c.n_heads, hd), cos.repeat(B, 1), sin.repeat(B, 1))
            k = apply_rope(_proj(h, w, "k_proj").view(B * L, c.n_kv_heads, hd), cos.repeat(B, 1), sin.repeat(B, 1))
            v = _proj(h, w, "v_proj").view(B, L, c.n_kv_heads, hd)
            group = c.n_heads // c.n_kv_heads
            q = q.view(B, L, c.n_heads, hd).transpose(1, 2)
            k = k.view(B, L, c.n_kv_heads, hd).transpose(1, 2).repeat_interleave(group, dim=1)
            v = v.transpose(1, 2).repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(x.dtype)
            x = x + a.transpose(1, 2).reshape(B, L, -1) @ w["attn_out"].T
            h = rms_norm(x, w["ff_norm"], c.rms_norm_eps)
            x = x + (F.silu(h @ w["ff_proj"].T) * (h @ w["up_proj"].T)) @ w["ff_out"].T
        x = rms_norm(x, self.ln_f, c.rms_norm_eps)
        return (x @ self.lm_head[: c.vocab_size].T).float()

    def _forward_row(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        kv: torch.Tensor | None,
        mode: str,
        kv_row: int,
        prefix_len: int,
        key_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self.config
        hd = c.head_dim
        cos, sin = rope_cos_sin(pos, hd, c.rope_theta)
        x = self.wte[ids]
        for layer_index, w in enumerate(self.layers):
            h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
            q = apply_rope(_proj(h, w, "q_proj").view(-1, c.n_heads, hd), cos, sin)
            k = apply_rope(_proj(h, w, "k_proj").view(-1, c.n_kv_heads, hd), cos, sin)
            v = _proj(h, w, "v_proj").view(-1, c.n_kv_heads, hd)
            if mode == "full":
                keys, values = k, v
                if kv is not None:
                    kv[kv_row, layer_index, 0][:, pos] = k.transpose(0, 1)
                    kv[kv_row, layer_index, 1][:, pos] = v.transpose(0, 1)
            elif mode == "dual":
                assert kv is not None  # forward refuses a cached mode without a KV buffer
                kv[kv_row, layer_index, 0][:, pos] = k.transpose(0, 1)
                kv[kv_row, layer_index, 1][:, pos] = v.transpose(0, 1)
                keys = kv[kv_row, layer_index, 0].transpose(0, 1)  # [L, KVH, hd]
                values = kv[kv_row, layer_index, 1].transpose(0, 1)
                if key_positions is not None:
                    keys, values = keys[key_positions], values[key_positions]
            else:  # prefix
                assert kv is not None  # forward refuses a cached mode without a KV buffer
                keys = torch.cat([kv[kv_row, layer_index, 0, :, :prefix_len].transpose(0, 1), k])
                values = torch.cat([kv[kv_row, layer_index, 1, :, :prefix_len].transpose(0, 1), v])
            a = attention(q, keys, values).reshape(-1, c.n_heads * hd)
            x = x + a @ w["attn_out"].T
            h = rms_norm(x, w["ff_norm"], c.rms_norm_eps)
            x = x + (F.silu(h @ w["ff_proj"].T) * (h @ w["up_proj"].T)) @ w["ff_out"].T
        x = rms_norm(x, self.ln_f, c.rms_norm_eps)
        return (x @ self.lm_head[: c.vocab_size].T).float()
