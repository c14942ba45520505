"""DUET (docs/ALGORITHMS.md section 18) in plain PyTorch: the float32 oracle for the native block
policy's ``prefix_kv_budget`` and ``query_keep_ratio`` (tests/decode/test_duet.py).

:class:`DuetModel` wraps a LLaDA2 or SDAR reference model and offers the ``forward_window`` each family's
``block_generate`` calls (``reference/llada2.py`` with ``cache=True``, ``reference/sdar.py``), with its own
layer loop: the decoder's rules (schedules, commits, edits, NFE) stay those of the block policy, and the
forwards of a block after its first one become sparse.

- Prefix K/V (18.1): the block's first forward is dense and yields each layer's block queries (after
  QK-norm and RoPE); each layer then selects at most ``prefix_kv_budget`` prefix positions (Raw-L1 distance,
  the union of every (head, row)'s nearest keys, filled or cut to the budget by the best distance; ties to
  the lower position) among the previous block's selection and the positions final since (else the whole
  prefix). The block's later forwards attend those keys and the block's own.
- Query rows (18.2): at a later forward, after ``query_select_layer`` the masked rows are ranked by the LM
  head applied to that layer's hidden state (no final norm, as the authors); the decided rows and
  ``min(m, max(1, ceil(ratio m)))`` of the ``m`` masks (those above ``threshold`` when enough are, else the
  most confident) run the deeper layers; the dropped rows keep the K/V of the block's previous forward and get
  uniform logits (the lowest confidence there is, so a step commits one only when it must commit more positions
  than were kept). A selection is reused for ``query_reuse_interval`` forwards while enough of its masks
  remain; a forward with at most ``query_dense_masks`` masks is dense.

Each part is off for a block whose prefix is shorter than its cost gate (``prefix_kv_min_context`` /
``query_min_context``; defaults: the contract's). The stats ``prefix_keys_selected`` and
``query_rows_dropped`` count as the native decoder's (section 18.4).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from .. import contract
from . import llada2, sdar
from .model import rms_norm, rotate_half

KV = list[tuple[torch.Tensor, torch.Tensor]]


class _LLaDA2Layers:
    def __init__(self, model: llada2.LLaDA2Reference):
        self.m, self.cfg, self.w = model, model.cfg, model.w
        self.layers = self.cfg.num_hidden_layers
        self.H, self.Hkv, self.hd = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        self.mask_id = model.mask_id

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w[llada2.PREFIX + "word_embeddings.weight"][ids]

    def qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, w, p = self.cfg, self.w, f"{llada2.PREFIX}layers.{i}."
        cos, sin = llada2.rope_cos_sin(int(positions.max()) + 1, cfg.rope_dim, cfg.rope_theta)
        cos, sin = cos[positions], sin[positions]
        x = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        n = x.shape[0]
        qkv = F.linear(x, w[p + "attention.query_key_value.weight"], w.get(p + "attention.query_key_value.bias"))
        q, k, v = qkv.view(n, self.H + 2 * self.Hkv, self.hd).split([self.H, self.Hkv, self.Hkv], dim=1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if cfg.use_qk_norm:
            q = rms_norm(q, w[p + "attention.query_layernorm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "attention.key_layernorm.weight"], cfg.rms_norm_eps)
        r = cfg.rope_dim
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        return q, k, v

    def finish_layer(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"{llada2.PREFIX}layers.{i}."
        h = h + F.linear(attn, w[p + "attention.dense.weight"], w.get(p + "attention.dense.bias"))
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        return h + (self.m._moe(p, x) if cfg.is_moe(i) else self.m._swiglu(p + "mlp.", x))

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        w = self.w
        return F.linear(
            h, w[llada2.PREFIX + "word_embeddings.weight"] if self.cfg.tie_word_embeddings else w["lm_head.weight"]
        )

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rms_norm(h, self.w[llada2.PREFIX + "norm.weight"], self.cfg.rms_norm_eps))


class _SDARLayers:
    def __init__(self, model: sdar.SDARReference):
        self.cfg, self.w = model.cfg, model.w
        self.layers = self.cfg.num_hidden_layers
        self.H, self.Hkv, self.hd = self.cfg.num_attention_heads, self.cfg.num_key_value_heads, self.cfg.head_dim
        self.mask_id = model.mask_id

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w[sdar.PREFIX + "embed_tokens.weight"][ids]

    def qkv(self, i: int, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cfg, w, p = self.cfg, self.w, f"{sdar.PREFIX}layers.{i}."
        cos, sin = sdar.rope_cos_sin(int(positions.max()) + 1, self.hd, cfg.rope_theta)
        cos, sin = cos[positions], sin[positions]
        x = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        n = x.shape[0]
        q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(n, self.H, self.hd).transpose(0, 1)
        k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(n, self.Hkv, self.hd).transpose(0, 1)
        v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(n, self.Hkv, self.hd).transpose(0, 1)
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def finish_layer(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        cfg, w, p = self.cfg, self.w, f"{sdar.PREFIX}layers.{i}."
        h = h + F.linear(attn, w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        mlp = F.silu(F.linear(x, w[p + "mlp.gate_proj.weight"])) * F.linear(x, w[p + "mlp.up_proj.weight"])
        return h + F.linear(mlp, w[p + "mlp.down_proj.weight"])

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        w = self.w
        return F.linear(
            h, w[sdar.PREFIX + "embed_tokens.weight"] if self.cfg.tie_word_embeddings else w["lm_head.weight"]
        )

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rms_norm(h, self.w[sdar.PREFIX + "norm.weight"], self.cfg.rms_norm_eps))


def select_prefix(q: torch.Tensor, keys: torch.Tensor, candidates: torch.Tensor, budget: int) -> torch.Tensor:
    """DUET's Raw-L1 selection (section 18.1) for one layer: ``q`` [H, B, hd] the block's queries,
    ``keys`` [Hkv, C, hd] the candidates' keys, ``candidates`` [C] their positions (ascending). Returns at
    most ``budget`` positions, ascending."""
    H, B, hd = q.shape
    Hkv, C = keys.shape[0], keys.shape[1]
    if C <= budget:
        return candidates
    # D[h, i, j] = sum_d |q[h, i, d] - k[h // (H / Hkv), j, d]|
    dist = torch.cdist(q.reshape(Hkv, (H // Hkv) * B, hd), keys, p=1.0).reshape(H * B, C)
    local = min(C, math.ceil(budget / (H * B)))
    union = torch.zeros(C, dtype=torch.bool)
    union[torch.sort(dist, dim=1, stable=True).indices[:, :local].reshape(-1)] = True
    order = torch.sort(dist.min(dim=0).values, stable=True).indices  # best distance of each key, ties: lower position
    keep = torch.zeros(C, dtype=torch.bool)
    if int(union.sum()) >= budget:
        keep[order[union[order]][:budget]] = True
    else:
        keep |= union
        keep[order[~union[order]][: budget - int(union.sum())]] = True
    return candidates[keep]


class DuetModel:
    """A LLaDA2 or SDAR reference model whose ``forward_window`` applies DUET (see the module doc); pass it
    to that family's ``block_generate`` (LLaDA2: ``cache=True``). ``threshold``: the decode's threshold (the
    query ranking's). One instance per decode."""

    def __init__(
        self,
        model: llada2.LLaDA2Reference | sdar.SDARReference,
        *,
        block_length: int,
        threshold: float,
        prefix_kv_budget: int = 0,
        prefix_kv_min_context: int = contract.DUET_PREFIX_GATE,
        query_keep_ratio: float = 1.0,
        query_select_layer: int | None = None,
        query_reuse_interval: int = 4,
        query_dense_masks: int = 4,
        query_min_context: int = contract.DUET_QUERY_GATE,
    ):
        self.sdar = isinstance(model, sdar.SDARReference)
        self.net: Any = _SDARLayers(model) if isinstance(model, sdar.SDARReference) else _LLaDA2Layers(model)
        self.B, self.threshold = block_length, threshold
        self.budget, self.prefix_gate = prefix_kv_budget, prefix_kv_min_context
        self.ratio, self.query_gate = query_keep_ratio, query_min_context
        self.select_layer = (5 if self.sdar else 1) if query_select_layer is None else query_select_layer
        self.interval, self.dense_masks = query_reuse_interval, query_dense_masks
        self.selected: list[torch.Tensor] | None = None  # per layer, for block `selected_block`
        self.selected_block = -1
        self.block = -1  # the block of the last forward
        self.own: KV | None = None  # the block's K/V per layer from its last forward (dropped rows keep them)
        self.kept: torch.Tensor | None = None  # the last fresh row selection (block offsets) and its age
        self.kept_age = 0
        self.stats = {"prefix_keys_selected": 0, "query_rows_dropped": 0}

    # the families' block_generate call these two
    def forward(self, ids: torch.Tensor, block_length: int | None) -> torch.Tensor:
        raise ValueError("DuetModel decodes with the block cache: block_generate(..., cache=True)")

    def forward_window(self, ids: torch.Tensor, start: int, *args: Any) -> tuple[torch.Tensor, KV]:
        cache: KV | None = args[0] if self.sdar else args[1]
        return self._forward(ids, start, cache)

    def _forward(self, ids: torch.Tensor, start: int, cache: KV | None) -> tuple[torch.Tensor, KV]:
        net, B = self.net, self.B
        n = ids.shape[0]
        end = start + n
        s = end - B  # the current block's start: the prefix is [0, s)
        b = s // B
        masks = ids[n - B :] == net.mask_id
        first = b != self.block
        if first:
            self.block, self.own, self.kept = b, None, None
        store = self.sdar and not bool(masks.any())  # SDAR's store forward: the block's final K/V, dense
        prefix_on = self.budget > 0 and s >= self.prefix_gate and s > self.budget
        sparse_keys = not first and not store and prefix_on and self.selected_block == b
        assert not sparse_keys or start == s, "a block's later forwards run the block alone"
        rows = self._query_rows(masks, s) if not first and not store and start == s else None
        positions = torch.arange(start, end)
        block_of = positions // B
        h = net.embed(ids)
        out_kv: KV = []
        captured: list[torch.Tensor] = []
        live = torch.arange(n)  # the rows still computed
        for i in range(net.layers):
            q, k, v = net.qkv(i, h, positions[live])
            own_k, own_v = k, v
            if live.numel() < n:  # dropped rows keep the block's previous K/V at this layer
                assert self.own is not None
                own_k, own_v = self.own[i][0].clone(), self.own[i][1].clone()
                own_k[:, live], own_v[:, live] = k, v
            out_kv.append((own_k, own_v))
            pk, pv = cache[i] if cache is not None else (own_k[:, :0], own_v[:, :0])
            if sparse_keys:
                assert self.selected is not None
                pk, pv = pk[:, self.selected[i]], pv[:, self.selected[i]]
            if first and prefix_on and not store:  # this dense forward's queries select the block's keys
                captured.append(q[:, -B:])
            keys, values = torch.cat([pk, own_k], dim=1), torch.cat([pv, own_v], dim=1)
            g = net.H // net.Hkv
            keys, values = keys.repeat_interleave(g, dim=0), values.repeat_interleave(g, dim=0)
            scores = torch.matmul(q, keys.transpose(1, 2)) * net.hd**-0.5
            allowed = torch.cat(
                [torch.ones(live.numel(), pk.shape[1], dtype=torch.bool), block_of[None, :] <= block_of[live][:, None]],
                dim=1,
            )
            scores = scores.masked_fill(~allowed, float("-inf"))
            attn = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), values)
            h = net.finish_layer(i, h, attn.transpose(0, 1).reshape(live.numel(), net.H * net.hd))
            if rows is not None and i == self.select_layer:
                keep = rows(h)
                if keep is not None:
                    self.stats["query_rows_dropped"] += n - int(keep.numel())
                    live, h = keep, h[keep]
        if sparse_keys:
            assert self.selected is not None
            self.stats["prefix_keys_selected"] += sum(int(t.numel()) for t in self.selected)
        if captured:
            self._select(captured, cache, out_kv, start, s)
        elif first:
            self.selected, self.selected_block = None, -1
        self.own = [(k[:, -B:], v[:, -B:]) for k, v in out_kv]
        logits = torch.zeros(n, net.lm_head(h[:1]).shape[-1])  # dropped rows: uniform
        logits[live] = net.logits(h)
        return logits, out_kv

    def _select(self, captured: list[torch.Tensor], cache: KV | None, out_kv: KV, start: int, s: int) -> None:
        B = self.B
        incremental = self.selected is not None and self.selected_block == self.block - 1
        chosen = []
        for i, q in enumerate(captured):
            prefix_k = out_kv[i][0][:, : s - start]
            if cache is not None:
                prefix_k = torch.cat([cache[i][0], prefix_k], dim=1)
            if incremental:
                assert self.selected is not None
                cand = torch.cat([self.selected[i], torch.arange(s - B, s)])
            else:
                cand = torch.arange(s)
            chosen.append(select_prefix(q, prefix_k[:, cand], cand, self.budget))
        self.selected, self.selected_block = chosen, self.block

    def _query_rows(self, masks: torch.Tensor, s: int) -> Any:
        """The row selection of a later forward of the block (None: dense), as a function of the selection
        layer's hidden state returning the kept rows (ascending) or None."""
        m = int(masks.sum())
        if (
            self.ratio >= 1.0
            or s < self.query_gate
            or m <= self.dense_masks
            or self.select_layer >= self.net.layers - 1
        ):
            self.kept = None
            return None
        count = min(m, max(1, math.ceil(self.ratio * m)))
        decided = (~masks).nonzero()[:, 0]

        def rows(h: torch.Tensor) -> torch.Tensor:
            if self.kept is not None and self.kept_age < self.interval:
                still = self.kept[masks[self.kept]]
                if still.numel() >= count:
                    self.kept_age += 1
                    return torch.cat([decided, still]).sort().values
            mask_rows = masks.nonzero()[:, 0]
            logits = self.net.lm_head(h[mask_rows]).float()
            p = F.softmax(logits, dim=-1).max(dim=-1).values
            high = p > self.threshold
            pick = mask_rows[high] if int(high.sum()) >= count else mask_rows[torch.topk(p, count).indices]
            self.kept, self.kept_age = pick, 1
            return torch.cat([decided, pick]).sort().values

        return rows


def duet_generate(
    model: llada2.LLaDA2Reference | sdar.SDARReference,
    prompt: torch.Tensor,
    *,
    duet: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The block policy with DUET: the family's ``block_generate(**options)`` over a :class:`DuetModel`
    built with the ``duet`` options (``prefix_kv_budget``, ``query_keep_ratio``, ...). Returns the canvas
    and the decoder's stats plus ``prefix_keys_selected`` and ``query_rows_dropped``."""
    is_sdar = isinstance(model, sdar.SDARReference)
    block_length = options.get("block_length", 4 if is_sdar else 32)
    threshold = options.get("threshold", 0.85 if is_sdar else 0.95)
    wrapped = DuetModel(model, block_length=block_length, threshold=threshold, **(duet or {}))
    if is_sdar:
        canvas, stats = sdar.block_generate(wrapped, prompt, **options)  # type: ignore[arg-type]
    else:
        canvas, stats = llada2.block_generate(wrapped, prompt, cache=True, **options)  # type: ignore[arg-type]
    return canvas, {**stats, **wrapped.stats}
