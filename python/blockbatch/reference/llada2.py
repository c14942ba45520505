"""LLaDA2 (``model_type`` "llada2_moe": LLaDA2.0 / 2.1, mini and flash) in plain PyTorch, written from
the spec to be read: the oracle for a native LLaDA2 forward and its ``block`` decoder.

The model. ``word_embeddings``; per layer ``h += attn(RMSNorm(h))``, ``h += mlp(RMSNorm(h))``; a final
RMSNorm and an untied ``lm_head`` (tied when ``tie_word_embeddings``). Output ``i`` predicts token
``i`` (no shift).

* Attention: one fused ``query_key_value`` projection split into ``[H, Hkv, Hkv]`` heads of
  ``head_dim`` (GQA: query head ``h`` reads kv head ``h // (H // Hkv)``), a per-head RMSNorm on q
  and k (QK-norm, weights of ``head_dim``) before RoPE, RoPE on the first
  ``rope_dim = int(head_dim * partial_rotary_factor)`` dims only (rotate-half pairing within
  them: dim ``i`` with ``i + rope_dim / 2``; the rest pass through), scale ``head_dim ** -0.5``,
  softmax in float32, output projection ``dense`` (with a bias when ``use_bias``).
* Block-causal attention: positions are cut into blocks of ``block_length`` aligned at absolute
  position 0, and a query sees every key of its own block and of every earlier block (an additive
  0 / -inf mask). So a block's keys and values depend only on the tokens up to its end.
* MLP: layers below ``first_k_dense_replace`` (every layer when ``num_experts`` is None) are a
  SwiGLU MLP of ``intermediate_size``. The others are a mixture of experts: router logits
  ``x @ gate.weight.T`` in float32, scores ``sigmoid(logits)``; the experts are chosen on
  ``scores + expert_bias``: the ``num_experts`` experts form ``n_group`` groups of consecutive
  experts, each group ranked by the sum of its two best scores, the best ``topk_group`` groups
  kept, then the ``num_experts_per_tok`` best experts among them (``torch.topk`` order). Their raw
  scores (without the bias), divided by their sum (plus 1e-20; not when one expert per token), times
  ``routed_scaling_factor``, weight the experts' SwiGLU outputs (``moe_intermediate_size``), summed
  in that order; plus the shared experts (one SwiGLU of ``moe_intermediate_size *
  num_shared_experts``).
* RoPE angles are float32 products of float32 inverse frequencies
  (``theta ** -(arange(0, rope_dim, 2) / rope_dim)``) and positions, as the authors' model computes
  them, so that float32 logits match theirs.

The decoder (``block_generate``): the authors' ``generate`` (LLaDA2.0; LLaDA2.1 with token editing),
see ``docs/ALGORITHMS.md`` section 11. Two defects of the shipped code are not reproduced, by
design: LLaDA2.0 samples at temperature 1 when given 0 (no greedy branch; here greedy is argmax,
LLaDA2.1's behaviour), and LLaDA2.1 adds its 0/1 block mask without ``.log()``, so its mask masks
nothing (here both use the 0 / -inf block-causal mask of LLaDA2.0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from .model import rms_norm, rotate_half  # the same arithmetic as the LLaDA / Dream reference

MODEL_TYPE = "llada2_moe"
PREFIX = "model."


@dataclasses.dataclass(frozen=True)
class LLaDA2Config:
    """The keys of a LLaDA2 ``config.json`` the forward reads (Hugging Face names)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    use_qkv_bias: bool = False
    use_bias: bool = True
    use_qk_norm: bool = True
    tie_word_embeddings: bool = False
    num_experts: int | None = 16
    num_shared_experts: int | None = 0
    num_experts_per_tok: int = 2
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int = 0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LLaDA2Config:
        """From a ``config.json`` dict; a missing key takes the default of the authors' config class
        (``head_dim``: ``hidden_size // num_attention_heads``)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in fields and v is not None}
        values.setdefault("head_dim", raw["hidden_size"] // raw["num_attention_heads"])
        if "num_experts" in raw and raw["num_experts"] is None:
            values["num_experts"] = None
        return cls(**values)

    @property
    def rope_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe(self, layer: int) -> bool:
        return self.num_experts is not None and layer >= self.first_k_dense_replace


def weight_shapes(cfg: LLaDA2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LLaDA2 checkpoint, with its shape (Hugging Face names)."""
    d, hd = cfg.hidden_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * hd
    shapes: dict[str, tuple[int, ...]] = {PREFIX + "word_embeddings.weight": (cfg.vocab_size, d)}

    def swiglu(prefix: str, width: int) -> None:
        shapes[prefix + "gate_proj.weight"] = (width, d)
        shapes[prefix + "up_proj.weight"] = (width, d)
        shapes[prefix + "down_proj.weight"] = (d, width)

    for i in range(cfg.num_hidden_layers):
        p = f"{PREFIX}layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        shapes[p + "attention.query_key_value.weight"] = (qkv, d)
        if cfg.use_qkv_bias:
            shapes[p + "attention.query_key_value.bias"] = (qkv,)
        if cfg.use_qk_norm:
            shapes[p + "attention.query_layernorm.weight"] = (hd,)
            shapes[p + "attention.key_layernorm.weight"] = (hd,)
        shapes[p + "attention.dense.weight"] = (d, cfg.num_attention_heads * hd)
        if cfg.use_bias:
            shapes[p + "attention.dense.bias"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        if cfg.is_moe(i):
            assert cfg.num_experts is not None and cfg.moe_intermediate_size is not None
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, d)
            shapes[p + "mlp.gate.expert_bias"] = (cfg.num_experts,)
            for e in range(cfg.num_experts):
                swiglu(f"{p}mlp.experts.{e}.", cfg.moe_intermediate_size)
            if cfg.num_shared_experts:
                swiglu(p + "mlp.shared_experts.", cfg.moe_intermediate_size * cfg.num_shared_experts)
        else:
            assert cfg.intermediate_size is not None
            swiglu(p + "mlp.", cfg.intermediate_size)
    shapes[PREFIX + "norm.weight"] = (d,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    return shapes


def random_weights(cfg: LLaDA2Config, seed: int = 0, logit_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Gaussian weights scaled by 1/sqrt(fan_in), norms near 1, small biases, a router whose expert
    biases spread the choices; ``logit_scale`` multiplies the LM head."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias") or name.endswith("expert_bias"):
            t = 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("word_embeddings.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / shape[1] ** 0.5
            if name == "lm_head.weight":
                t = t * logit_scale
        out[name] = t.float()
    return out


def rope_cos_sin(length: int, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin tables ``[length, rope_dim]`` (rotate-half layout), in float32 as the authors' model."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.int64).float() / rope_dim))
    freqs = torch.arange(length, dtype=torch.float32)[:, None] @ inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def block_causal_mask(length: int, block_length: int) -> torch.Tensor:
    """``[length, length]`` additive mask: 0 where the key's block is not after the query's, else -inf."""
    block = torch.arange(length) // block_length
    return torch.where(block[None, :] <= block[:, None], 0.0, float("-inf"))


def route(cfg: LLaDA2Config, logits: torch.Tensor, expert_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts of each token (``[n, k]``, best first) and their weights, from float32 router logits."""
    scores = torch.sigmoid(logits)
    biased = scores + expert_bias
    n, e = biased.shape
    group_scores = biased.view(n, cfg.n_group, e // cfg.n_group).topk(2, dim=-1)[0].sum(dim=-1)
    kept_groups = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, kept_groups, 1.0)
    expert_mask = group_mask.unsqueeze(-1).expand(n, cfg.n_group, e // cfg.n_group).reshape(n, e)
    chosen = torch.topk(biased.masked_fill(expert_mask == 0, float("-inf")), k=cfg.num_experts_per_tok, dim=-1)[1]
    weights = scores.gather(1, chosen)
    if cfg.num_experts_per_tok > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return chosen, weights * cfg.routed_scaling_factor


class LLaDA2Reference:
    """The float32 forward of a LLaDA2 checkpoint's weights (``weights``: Hugging Face names);
    ``mask_id`` / ``eos_id``: the checkpoint's special ids, kept for callers that decode with it."""

    def __init__(
        self,
        cfg: LLaDA2Config,
        weights: dict[str, torch.Tensor],
        mask_id: int | None = None,
        eos_id: int | None = None,
    ):
        self.cfg = cfg
        self.w = {k: v.float() for k, v in weights.items()}
        self.mask_id, self.eos_id = mask_id, eos_id

    def _swiglu(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        w = self.w
        return F.linear(
            F.silu(F.linear(x, w[prefix + "gate_proj.weight"])) * F.linear(x, w[prefix + "up_proj.weight"]),
            w[prefix + "down_proj.weight"],
        )

    def _moe(self, p: str, x: torch.Tensor) -> torch.Tensor:
        cfg, w = self.cfg, self.w
        chosen, weights = route(
            cfg, F.linear(x.float(), w[p + "mlp.gate.weight"].float()), w[p + "mlp.gate.expert_bias"]
        )
        out = torch.zeros(x.shape[0], cfg.num_experts_per_tok, x.shape[1], dtype=x.dtype)
        for e in chosen.unique().tolist():  # each expert once, on the tokens that chose it
            rows, slots = (chosen == e).nonzero(as_tuple=True)
            out[rows, slots] = self._swiglu(f"{p}mlp.experts.{e}.", x[rows])
        y = (out * weights.unsqueeze(-1)).sum(dim=1)
        if cfg.num_shared_experts:
            y = y + self._swiglu(p + "mlp.shared_experts.", x)
        return y

    def _attention(
        self,
        p: str,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cached: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The attention of the queries ``x`` over the ``cached`` keys and values (``[Hkv, s, hd]``,
        after norm and RoPE) followed by their own; returns its output and the queries' own K/V."""
        cfg, w = self.cfg, self.w
        n, hd, H, Hkv = x.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        qkv = F.linear(x, w[p + "attention.query_key_value.weight"], w.get(p + "attention.query_key_value.bias"))
        q, k, v = qkv.view(n, H + 2 * Hkv, hd).split([H, Hkv, Hkv], dim=1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, n, hd]
        if cfg.use_qk_norm:
            q = rms_norm(q, w[p + "attention.query_layernorm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "attention.key_layernorm.weight"], cfg.rms_norm_eps)
        r = cfg.rope_dim
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        own = (k, v)
        if cached is not None:
            k, v = torch.cat([cached[0], k], dim=1), torch.cat([cached[1], v], dim=1)
        k, v = k.repeat_interleave(H // Hkv, dim=0), v.repeat_interleave(H // Hkv, dim=0)
        scores = torch.matmul(q, k.transpose(1, 2)) * hd**-0.5
        if mask is not None:
            scores = scores + mask
        attn = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), v)
        out = F.linear(
            attn.transpose(0, 1).reshape(n, H * hd), w[p + "attention.dense.weight"], w.get(p + "attention.dense.bias")
        )
        return out, own

    def forward(self, ids: torch.Tensor, block_length: int | None) -> torch.Tensor:
        """Logits ``[len(ids), vocab]`` of the canvas ``ids`` at positions ``0..len-1``, block-causal
        with blocks of ``block_length`` (None: bidirectional, no mask)."""
        return self.forward_window(ids, 0, block_length, None)[0]

    def forward_window(
        self,
        ids: torch.Tensor,
        start: int,
        block_length: int | None,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The logits of the tokens ``ids`` at positions ``start..start+len-1``, attending to the
        ``cache`` (per layer K and V ``[Hkv, start, hd]`` of positions ``0..start-1``, after norm and
        RoPE) and to themselves, block-causal; returns the logits and the window's own K/V per layer.
        Block-causal attention makes this exact: the K/V of a finished block never change."""
        cfg, w = self.cfg, self.w
        n = ids.shape[0]
        h = w[PREFIX + "word_embeddings.weight"][ids]
        cos, sin = rope_cos_sin(start + n, cfg.rope_dim, cfg.rope_theta)
        cos, sin = cos[start:], sin[start:]
        mask = block_causal_mask(start + n, block_length)[start:] if block_length is not None else None
        kv = []
        for i in range(cfg.num_hidden_layers):
            p = f"{PREFIX}layers.{i}."
            normed = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            out, own = self._attention(p, normed, cos, sin, mask, cache[i] if cache is not None else None)
            kv.append(own)
            h = h + out
            x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            h = h + (self._moe(p, x) if cfg.is_moe(i) else self._swiglu(p + "mlp.", x))
        h = rms_norm(h, w[PREFIX + "norm.weight"], cfg.rms_norm_eps)
        head = w[PREFIX + "word_embeddings.weight"] if cfg.tie_word_embeddings else w["lm_head.weight"]
        return F.linear(h, head), kv


def transfer_schedule(block_length: int, steps: int) -> list[int]:
    """Tokens to commit at each of a block's ``steps`` steps (LLaDA2.0): ``block_length // steps``
    each, one more for the first ``block_length % steps``."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if s < extra else 0) for s in range(steps)]


def block_generate(
    model: LLaDA2Reference,
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int = 32,
    steps: int = 32,
    threshold: float = 0.95,
    edit_threshold: float | None = None,
    max_post_steps: int = 16,
    stop_on_eos: bool = False,
    minimal_topk: int = 1,
    eos_id: int,
    mask_id: int,
    cache: bool = False,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The ``block`` policy: LLaDA2.0 (``edit_threshold`` None) or LLaDA2.1 with token editing, greedy.

    Returns the canvas (prompt + ``gen_length`` positions; the text ends at the first EOS after
    the prompt) and stats: ``nfe`` (forwards), ``forwards_per_block``, ``edits`` (LLaDA2.1:
    committed tokens replaced) and ``query_tokens`` (per forward). Without ``cache`` every forward
    runs the whole window up to the current block, as the authors' code does; with it (the exact
    block cache, section 11.1) a forward runs the current block only, except the first of a block,
    which also runs the previous block (its final K/V are written then: no extra forward) and, for
    the first decoded block, the prompt's complete blocks (prefilled in the same forward).
    """
    P = prompt.numel()
    steps = min(steps, gen_length // minimal_topk)
    num_blocks = (P + gen_length + block_length - 1) // block_length
    x = torch.full((num_blocks * block_length,), mask_id, dtype=torch.long)
    x[:P] = prompt
    nfe, edits, per_block, query_tokens = 0, 0, [], []
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # cache=True: K/V of positions < cached
    cached = 0

    def predict(end: int) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal nfe, kv, cached
        nfe += 1
        if not cache:  # the authors' way: the whole window every step
            query_tokens.append(end)
            logits = model.forward(x[:end], block_length)[end - block_length : end].float()
        else:  # the exact cache: queries from the first position whose K/V are not final yet
            query_tokens.append(end - cached)
            window, new_kv = model.forward_window(x[cached:end], cached, block_length, kv)
            logits = window[-block_length:].float()
            final = end - block_length - cached  # the blocks before the current one are finished
            if kv is None:
                kv = [(k[:, :final], v[:, :final]) for k, v in new_kv]
            else:
                kv = [
                    (torch.cat([ok, k[:, :final]], dim=1), torch.cat([ov, v[:, :final]], dim=1))
                    for (ok, ov), (k, v) in zip(kv, new_kv)
                ]
            cached = end - block_length
        x0 = logits.argmax(dim=-1)
        return x0, F.softmax(logits, dim=-1).gather(-1, x0[:, None])[:, 0]

    def commit_masks(active: torch.Tensor, p: torch.Tensor, at_least: int) -> torch.Tensor:
        """The masked positions to commit: those above ``threshold`` if at least ``at_least`` are, else
        the ``at_least`` most confident (``torch.topk``)."""
        confidence = torch.where(active, p, torch.tensor(float("-inf")))
        high = (confidence > threshold) & active
        if int(high.sum()) >= at_least:
            return high
        chosen = torch.zeros_like(active)
        chosen[torch.topk(confidence, k=min(at_least, int(active.sum()))).indices] = True
        return chosen

    stopped = False
    for b in range(P // block_length, num_blocks):
        start, end, before = b * block_length, (b + 1) * block_length, nfe
        block = x[start:end]  # a view: commits write into x
        if edit_threshold is None:  # LLaDA2.0
            for at_least in transfer_schedule(block_length, steps) if steps else []:
                active = block == mask_id
                if not active.any():
                    break
                x0, p = predict(end)
                transfer = commit_masks(active, p, at_least)
                block[transfer] = x0[transfer]
                if stop_on_eos and (x0[transfer] == eos_id).any():
                    eos_at = (x[:end] == eos_id).nonzero()
                    if len(eos_at) and not (x[P : int(eos_at[0])] == mask_id).any():
                        stopped = True
                        break
            per_block.append(nfe - before)
            if stopped or (x[P:end] == eos_id).any():
                break
        else:  # LLaDA2.1: commits and edits in the same step
            in_prompt = torch.arange(start, end) < P
            post_steps = 0
            while True:
                old = block.clone()
                active = old == mask_id
                if not active.any():
                    post_steps += 1
                if post_steps > max_post_steps:
                    break
                x0, p = predict(end)
                transfer = commit_masks(active, p, 1) if active.any() else torch.zeros_like(active)
                editable = ~active & ~in_prompt
                edit = editable & (torch.where(editable, p, torch.tensor(float("-inf"))) > edit_threshold) & (x0 != old)
                block[transfer | edit] = x0[transfer | edit]
                edits += int(edit.sum())
                if not active.any() and not edit.any():
                    break
            per_block.append(nfe - before)
            generated = x[P:end]
            if stop_on_eos and not (generated == mask_id).any() and (generated == eos_id).any():
                break
    canvas = x[: P + gen_length].clone()
    return canvas, {"nfe": nfe, "forwards_per_block": per_block, "edits": edits, "query_tokens": query_tokens}


def generated_text_ids(canvas: torch.Tensor, prompt_length: int, eos_id: int) -> list[int]:
    """The generation of a ``block_generate`` canvas as the authors return it: up to and including
    the first EOS after the prompt."""
    gen = canvas[prompt_length:].tolist()
    return gen[: gen.index(eos_id) + 1] if eos_id in gen else gen


def cfg_ok(cfg: LLaDA2Config) -> None:
    """Shape checks a LLaDA2 config must pass (ValueError naming the key)."""
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError("num_key_value_heads must divide num_attention_heads")
    if cfg.rope_dim % 2 or not 0 < cfg.rope_dim <= cfg.head_dim:
        raise ValueError(f"head_dim * partial_rotary_factor = {cfg.rope_dim} must be even and in (0, head_dim]")
    if cfg.num_experts is not None and cfg.num_experts % cfg.n_group:
        raise ValueError("n_group must divide num_experts")
    if cfg.num_experts is not None and cfg.topk_group > cfg.n_group:
        raise ValueError("topk_group must be at most n_group")
