"""Block-diffusion SFT of the block-causal toys on the toy task (CPU, deterministic): the LLaDA2-layout
toy (``toy/checkpoint_llada2``) and, with ``--family sdar``, the SDAR-layout one (``toy/checkpoint_sdar``).

    python tools/train_toy_llada2.py [--family llada2|sdar] [--out DIR] [--steps 2500] [--threads 1] [--quiet]
    python tools/train_toy_llada2.py --edit [--init-from DIR] [--edit-prob 0.15] [--stale-prob 0.5] ...

SDAR (``--family sdar``, ``SDAR_DEFAULTS``): a dense Qwen3 body (d_model 128, 4 layers, 4 query / 2 KV heads
of 32 dims, QK-norm, RoPE on the whole head, MLP 384), trained on blocks of 4, 8 and 16 (a block length drawn per
step) so that one toy decodes at each; its forward below is ``reference/sdar.py``'s over a batch, and
its held-out accuracy is measured with the native ``block`` decoder's SDAR rules (blocks of 4, dynamic
at 0.85 and one token a step). The rest of this docstring is the LLaDA2 toy's.

The model is a small LLaDA2 (``model_type`` "llada2_moe"): d_model 128, 4 layers (the first dense,
then mixtures of 8 experts in 4 groups, 2 kept, top-2 plus a shared expert), 4 query / 2 KV heads
of 32 dims with QK-norm and RoPE on half of each head, the toy's tokenizer. Its attention is
block-causal with blocks of 32 aligned at position 0, as LLaDA2 is trained and decoded.

The objective is the block-diffusion one at the toy's scale: each row (prompt + response padded
with EOS, as ``train_toy.py`` builds it) picks one block holding response positions (three times in
four one holding the answer or its closing EOS, else any, EOS padding included); the blocks
before it stay clean (what the decoder sees: finished blocks), the block's response positions are
masked with probability ``t`` (stratified ``t ~ U(eps, 1)``), and the loss is the cross-entropy on
the masked positions weighted ``1/t`` and divided by the block's response positions. The blocks
after it do not matter (block-causal attention hides them). The training forward below is the
reference's arithmetic (``reference/llada2.py``) over a batch of rows; ``tests/tools/
test_train_toy_llada2.py`` checks it equals ``LLaDA2Reference.forward`` row by row. Held-out
accuracy is measured with the native ``block`` decoder (LLaDA2.0 settings: threshold 0.95, and one
token a step). Everything is seeded and runs on a fixed thread count (2 by default), so a run reproduces the shipped
checkpoint on the same software stack (``learning_curve.json`` records the sha256).

The editing toy (``--edit``, ``EDIT_DEFAULTS``: ``toy/checkpoint_llada2_edit``) is LLaDA2.1's recipe at the toy's
scale: LLaDA2.0 continued with a token-to-token (T2T) objective, so that at decode time a decided position whose
argmax differs from its token with probability above ``edit_threshold`` is a repair, not noise. It starts from
the shipped LLaDA2 toy's weights (``--init-from``) and trains a few hundred steps on the same data with the same
block choice, plus:

* of the chosen block's response positions that stay unmasked, each is replaced with probability
  ``edit_prob`` by a wrong token (uniform over the toy's characters and EOS, never the original), and the loss
  also asks for the original token at every unmasked response position of the block: the corrupted ones (a
  repair) and the clean ones (keep the token), cross-entropy weighted 1 (the masked positions keep ``1/t``),
  all over the block's response positions;
* with probability ``stale_prob`` a row also noises the block before it (masks at the same ``t``, wrong tokens
  at ``edit_prob``) and trains it with the same loss: the chosen block then learns to draft against a stale,
  partly masked or wrong upstream (what ``wavefront`` shows a downstream block) and the upstream to repair its
  own wrong tokens. Block-causal attention keeps the upstream block's logits blind to the chosen one, so both are
  honest samples of one forward.

A model trained on masked positions only (the LLaDA2 toy) was never asked anything at decided positions, so its
argmax there is arbitrary and edits at 0.9 rewrite correct answers; this objective is what makes them repairs.
Held-out accuracy is measured as for the LLaDA2 toy plus LLaDA2.1's decoder (``block`` with edit_threshold 0.9).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import torch
import torch.nn.functional as F

from blockbatch.config import ModelConfig
from blockbatch.families import llada2 as fam
from blockbatch.families import sdar as sdar_fam
from blockbatch.reference import llada2 as ref
from blockbatch.reference import sdar as sdar_ref
from blockbatch.reference.model import rms_norm, rotate_half
from blockbatch.toy import CHECKPOINT_DIRS, LLADA2_EDIT_CHECKPOINT_DIR
from blockbatch.toy import task as toy_task
from blockbatch.toy import tokenizer as toy_tok
from train_toy import Progress, data_streams, lr_at, make_batch, make_optimizer, save_run

DEFAULT_OUT = CHECKPOINT_DIRS["llada2"]
EDIT_OUT = LLADA2_EDIT_CHECKPOINT_DIR
# The wrong tokens of the T2T objective: the toy's characters and EOS (never PAD, UNK or MASK).
WRONG_TOKENS = torch.tensor([toy_tok.VOCAB.index(c) for c in toy_tok.CHARS] + [toy_tok.EOS_ID])


@dataclasses.dataclass
class TrainConfig:
    family: str = "llada2"  # "llada2" or "sdar": the layout, forward and decoder of the toy
    task: str = "arith"  # train_toy.TASKS (data_streams reads it)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_size: int = 32
    rope_dims: int = 16
    mlp_hidden_size: int = 384
    num_experts: int = 8
    experts_per_token: int = 2
    expert_groups: int = 4
    expert_groups_kept: int = 2
    moe_hidden_size: int = 96
    shared_experts: int = 1
    first_dense_layers: int = 1
    block_length: int = 32
    block_lengths: tuple[int, ...] = ()  # a block length drawn per step from these (empty: block_length)
    rope_theta: float = 10000.0
    max_sequence_length: int = 512
    steps: int = 3000
    tokens_per_step: int = 4656
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    eps: float = 1e-3
    canvas_lengths: tuple[int, ...] = (64, 128)
    canvas_weights: tuple[float, ...] = (0.8, 0.2)
    seed: int = 0
    threads: int = 2
    log_every: int = 25
    eval_every: int = 500
    eval_n: int = 64
    eval_gen_length: int = 64
    edit_prob: float = 0.0  # T2T: a wrong token at each unmasked response position of the block (0: LLaDA2.0's)
    stale_prob: float = 0.0  # T2T: the share of rows whose previous block is noised and trained too
    init_from: str = ""  # a checkpoint folder to continue from (empty: init_weights)


# What ``--edit`` changes: LLaDA2.1's continued training of the LLaDA2 toy with the T2T objective.
EDIT_DEFAULTS: dict = dict(
    edit_prob=0.15,
    stale_prob=0.5,
    steps=300,
    lr=5e-4,
    warmup=30,
    eval_every=150,
    threads=1,  # the machine is shared: one thread trains faster than two oversubscribed ones
)


# What ``--family sdar`` changes (anything can still be overridden): a smaller dense body, SDAR's blocks.
SDAR_DEFAULTS: dict = dict(
    family="sdar",
    d_model=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_size=32,
    mlp_hidden_size=384,
    block_length=4,
    block_lengths=(4, 8, 16),
    steps=3000,
    threads=1,
)


def train_config(family: str = "llada2", **overrides) -> TrainConfig:
    """``TrainConfig`` with the defaults of ``family`` (``SDAR_DEFAULTS`` for sdar), then ``overrides``."""
    if family not in ("llada2", "sdar"):
        raise ValueError(f"family must be llada2 or sdar, got {family!r}")
    return TrainConfig(**{**(SDAR_DEFAULTS if family == "sdar" else {}), **overrides, "family": family})


def model_config(tc: TrainConfig) -> ModelConfig:
    if tc.family == "sdar":
        return ModelConfig(
            d_model=tc.d_model,
            n_layers=tc.n_layers,
            n_heads=tc.n_heads,
            n_kv_heads=tc.n_kv_heads,
            head_size=tc.head_size,
            mlp_hidden_size=tc.mlp_hidden_size,
            max_sequence_length=tc.max_sequence_length,
            rope_theta=tc.rope_theta,
            vocab_size=toy_tok.VOCAB_SIZE,
            embedding_size=toy_tok.VOCAB_SIZE,
            rms_norm_eps=1e-6,
            weight_tying=False,
            mask_token_id=toy_tok.MASK_ID,
            eos_token_id=toy_tok.EOS_ID,
            pad_token_id=toy_tok.PAD_ID,
            model_type=sdar_fam.MODEL_TYPE,
            qk_norm=True,
        ).validate()
    fields = {f: getattr(tc, f) for f in fam.LLADA2_MINI if hasattr(tc, f) and f != "vocab_size"}
    return ModelConfig(
        **fields,
        vocab_size=toy_tok.VOCAB_SIZE,
        embedding_size=toy_tok.VOCAB_SIZE,
        rms_norm_eps=1e-6,
        weight_tying=False,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        pad_token_id=toy_tok.PAD_ID,
        model_type=fam.MODEL_TYPE,
        qk_norm=True,
        routed_scaling=2.5,
    ).validate()


def init_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """GPT-2 style: N(0, 1) embeddings, 1/sqrt(fan_in) projections, residual outputs (``dense``,
    ``down_proj``) scaled by 1/sqrt(2 * n_layers), the LM head by 0.1, unit norms, zero expert biases."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    shapes = (sdar_fam if config.family == "sdar" else fam).weight_shapes(config)
    for name, shape in shapes.items():
        if name.endswith("expert_bias") or name.endswith(".bias"):
            t = torch.zeros(shape)
        elif len(shape) == 1:
            t = torch.ones(shape)
        elif name.endswith(("word_embeddings.weight", "embed_tokens.weight")):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            if name.endswith((".dense.weight", ".o_proj.weight", ".down_proj.weight")):
                t = t / math.sqrt(2 * config.n_layers)
            elif name == "lm_head.weight":
                t = t * 0.1
        out[name] = t.requires_grad_(True)
    return out


def sdar_forward_batch(
    cfg: sdar_ref.SDARConfig, w: dict[str, torch.Tensor], ids: torch.Tensor, block: int
) -> torch.Tensor:
    """Logits ``[B, T, V]`` of SDAR rows ``ids`` ``[B, T]``, block-causal: ``SDARReference.forward`` over a
    batch, differentiable."""
    B, T = ids.shape
    H, Hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    P = sdar_ref.PREFIX
    cos, sin = sdar_ref.rope_cos_sin(T, hd, cfg.rope_theta)
    mask = ref.block_causal_mask(T, block)
    h = w[P + "embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"{P}layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = F.linear(x, w[p + "self_attn.q_proj.weight"]).view(B, T, H, hd).transpose(1, 2)
        k = F.linear(x, w[p + "self_attn.k_proj.weight"]).view(B, T, Hkv, hd).transpose(1, 2)
        v = F.linear(x, w[p + "self_attn.v_proj.weight"]).view(B, T, Hkv, hd).transpose(1, 2)
        q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
        k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * hd**-0.5 + mask
        attn = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), v)
        h = h + F.linear(attn.transpose(1, 2).reshape(B, T, H * hd), w[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate = F.linear(x, w[p + "mlp.gate_proj.weight"])
        h = h + F.linear(F.silu(gate) * F.linear(x, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
    h = rms_norm(h, w[P + "norm.weight"], cfg.rms_norm_eps)
    return F.linear(h, w["lm_head.weight"])


def forward_batch(cfg, w: dict[str, torch.Tensor], ids: torch.Tensor, block: int) -> torch.Tensor:
    """Logits ``[B, T, V]`` of rows ``ids`` ``[B, T]`` at positions ``0..T-1``, block-causal: the
    reference's forward (``LLaDA2Reference.forward``; SDAR's: ``sdar_forward_batch``) over a batch,
    differentiable."""
    if isinstance(cfg, sdar_ref.SDARConfig):
        return sdar_forward_batch(cfg, w, ids, block)
    B, T = ids.shape
    H, Hkv, hd, r = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rope_dim
    P = ref.PREFIX
    cos, sin = ref.rope_cos_sin(T, r, cfg.rope_theta)
    mask = ref.block_causal_mask(T, block)
    h = w[P + "word_embeddings.weight"][ids]

    def swiglu(prefix: str, x: torch.Tensor) -> torch.Tensor:
        gate = F.linear(x, w[prefix + "gate_proj.weight"])
        return F.linear(F.silu(gate) * F.linear(x, w[prefix + "up_proj.weight"]), w[prefix + "down_proj.weight"])

    for i in range(cfg.num_hidden_layers):
        p = f"{P}layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        qkv = F.linear(x, w[p + "attention.query_key_value.weight"], w.get(p + "attention.query_key_value.bias"))
        q, k, v = qkv.view(B, T, H + 2 * Hkv, hd).split([H, Hkv, Hkv], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
        if cfg.use_qk_norm:
            q = rms_norm(q, w[p + "attention.query_layernorm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "attention.key_layernorm.weight"], cfg.rms_norm_eps)
        q = torch.cat([q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]], dim=-1)
        k = torch.cat([k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]], dim=-1)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * hd**-0.5 + mask
        attn = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32), v)
        h = h + F.linear(
            attn.transpose(1, 2).reshape(B, T, H * hd),
            w[p + "attention.dense.weight"],
            w.get(p + "attention.dense.bias"),
        )
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps).reshape(B * T, -1)
        if cfg.is_moe(i):
            chosen, weights = ref.route(
                cfg, F.linear(x.float(), w[p + "mlp.gate.weight"]), w[p + "mlp.gate.expert_bias"]
            )
            out = torch.zeros(B * T, cfg.num_experts_per_tok, x.shape[1])
            for e in chosen.unique().tolist():
                rows, slots = (chosen == e).nonzero(as_tuple=True)
                out = out.index_put((rows, slots), swiglu(f"{p}mlp.experts.{e}.", x[rows]))
            y = (out * weights.unsqueeze(-1)).sum(dim=1)
            if cfg.num_shared_experts:
                y = y + swiglu(p + "mlp.shared_experts.", x)
        else:
            y = swiglu(p + "mlp.", x)
        h = h + y.view(B, T, -1)
    h = rms_norm(h, w[P + "norm.weight"], cfg.rms_norm_eps)
    return F.linear(h, w["lm_head.weight"])


def block_diffusion_loss(
    cfg: ref.LLaDA2Config,
    w: dict[str, torch.Tensor],
    ids: torch.Tensor,
    resp: torch.Tensor,
    block: int,
    g: torch.Generator,
    eps: float,
    edit_prob: float = 0.0,
    stale_prob: float = 0.0,
) -> torch.Tensor:
    """The loss of one block per row (see the module docstring); with ``edit_prob`` / ``stale_prob`` > 0 the
    T2T objective of the editing toy (wrong tokens, the loss at unmasked positions, a stale previous block)."""
    B, T = ids.shape
    u = torch.rand((), generator=g)
    t = ((u + torch.arange(B) / B) % 1.0) * (1 - eps) + eps
    first = resp.float().argmax(1)  # the prompt's length: the first response position
    # The blocks to train: those holding the answer (its tokens and the first EOS after it) three
    # times in four, any response block (EOS padding too) otherwise.
    answer_end = first + (resp & (ids != toy_tok.EOS_ID)).sum(1)  # the first EOS after the answer
    lo = first // block
    any_block = torch.rand(B, generator=g) < 0.25
    hi = torch.where(any_block, torch.full_like(lo, (T - 1) // block), answer_end // block)
    k = torch.minimum(lo + (torch.rand(B, generator=g) * (hi - lo + 1).float()).long(), hi)
    pos_block = torch.arange(T)[None, :] // block
    target = resp & (pos_block == k[:, None])  # the chosen block's response positions
    t2t = edit_prob > 0 or stale_prob > 0
    if t2t:  # the T2T draws come after LLaDA2.0's, so edit_prob = stale_prob = 0 reproduces its stream
        stale = (torch.rand(B, generator=g) < stale_prob) & (k > lo)
        target = target | (resp & stale[:, None] & (pos_block == (k - 1)[:, None]))
    masked = target & (torch.rand(ids.shape, generator=g) < t[:, None])
    noisy = torch.where(masked, torch.full_like(ids, toy_tok.MASK_ID), ids)
    if t2t:
        wrong = target & ~masked & (torch.rand(ids.shape, generator=g) < edit_prob)
        n = len(WRONG_TOKENS)
        r = torch.randint(0, n, ids.shape, generator=g)
        other = WRONG_TOKENS[(r + torch.randint(1, n, ids.shape, generator=g)) % n]  # never WRONG_TOKENS[r]
        draw = torch.where(WRONG_TOKENS[r] == ids, other, WRONG_TOKENS[r])
        noisy = torch.where(wrong, draw, noisy)
    logits = forward_batch(cfg, w, noisy, block)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="none").view(B, T)
    per_row = (ce * masked).sum(1) / t
    if t2t:
        per_row = per_row + (ce * (target & ~masked)).sum(1)
    return (per_row / target.sum(1).clamp(min=1)).mean()


@torch.no_grad()
def heldout(
    config: ModelConfig,
    weights: dict,
    tokenizer,
    problems,
    gen_length: int,
    threshold: float | None,
    block: int = 32,
    edit_threshold: float | None = None,
):
    """Accuracy and mean NFE of the native block decoder (blocks of ``block``; threshold, or one token a step;
    LLaDA2.1's edits above ``edit_threshold`` when given)."""
    from blockbatch import DecodeOptions
    from blockbatch.native import NativeModel

    model = NativeModel(config, {k: v.detach() for k, v in weights.items()})
    o = DecodeOptions(
        policy="block", gen_length=gen_length, block_length=block, threshold=threshold, edit_threshold=edit_threshold
    )
    ok, nfe = 0, 0
    for p in problems:
        out = torch.ops.blockbatch.decode(model.obj, torch.tensor(toy_tok.encode(tokenizer, p.prompt)), o.native)
        prompt_len = len(toy_tok.encode(tokenizer, p.prompt))
        ok += toy_task.check_answer(p, toy_tok.decode_response(tokenizer, out[0][prompt_len:].tolist()))
        nfe += int(out[1][0])
    return ok / len(problems), nfe / len(problems)


def _repo_relative(path: str) -> str:
    """``path`` relative to the repository root when inside it (what a shipped learning curve records)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full = os.path.abspath(path)
    return os.path.relpath(full, root) if full.startswith(root + os.sep) else path


def train(tc: TrainConfig, out: str | None = None, quiet: bool = False) -> dict:
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    config = model_config(tc)
    cfg = (sdar_fam if tc.family == "sdar" else fam).reference_config(config)
    tokenizer = toy_tok.build_tokenizer()
    weights = init_weights(config, tc.seed)
    if tc.init_from:  # continued training (the editing toy from the LLaDA2 toy, as LLaDA2.1 from LLaDA2.0)
        from blockbatch.loading import load_checkpoint

        start = load_checkpoint(tc.init_from, torch.float32)
        if set(start.weights) != set(weights) or any(start.weights[n].shape != w.shape for n, w in weights.items()):
            raise ValueError(f"init_from: {tc.init_from} does not hold the weights of this TrainConfig's model")
        weights = {n: start.weights[n].clone().requires_grad_(True) for n in weights}
    router = [n for n in weights if n.endswith("mlp.gate.weight")]  # no decay on the router
    decay = [w for n, w in weights.items() if w.dim() == 2 and n not in router]
    opt = make_optimizer(tc, decay, [w for n, w in weights.items() if w.dim() < 2 or n in router])
    g, rng, stream, eval_problems = data_streams(tc)
    n_params = sum(w.numel() for w in weights.values())
    curve: list[dict] = []
    progress = Progress(tc.steps, tc.log_every)
    if not quiet:
        progress.note(
            f"toy {tc.family} model: {n_params / 1e6:.2f}M parameters, {tc.steps} steps, {tc.threads} threads"
        )
    running, running_n, ema = 0.0, 0, 0.0
    t0 = time.perf_counter()
    for step in range(1, tc.steps + 1):
        canvas = rng.choices(tc.canvas_lengths, weights=tc.canvas_weights)[0]
        rows = max(1, tc.tokens_per_step // (toy_task.PROMPT_CHARS + canvas))
        ids, resp = make_batch(tokenizer, [next(stream) for _ in range(rows)], canvas)
        for group in opt.param_groups:
            group["lr"] = lr_at(tc, step - 1)  # type: ignore[arg-type]
        block = rng.choice(tc.block_lengths) if tc.block_lengths else tc.block_length
        loss = block_diffusion_loss(cfg, weights, ids, resp, block, g, tc.eps, tc.edit_prob, tc.stale_prob)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), tc.grad_clip)
        opt.step()
        value = loss.item()
        running, running_n = running + value, running_n + 1
        ema = value if step == 1 else 0.95 * ema + 0.05 * value
        if step % tc.log_every == 0 or step == tc.steps:
            rec = {"step": step, "loss": round(running / running_n, 5), "elapsed_s": round(time.perf_counter() - t0, 1)}
            running, running_n = 0.0, 0
            if tc.eval_every and (step % tc.eval_every == 0 or step == tc.steps):
                B, t = tc.block_length, 0.85 if tc.family == "sdar" else 0.95
                acc, nfe = heldout(config, weights, tokenizer, eval_problems, tc.eval_gen_length, None, B)
                acc_t, nfe_t = heldout(config, weights, tokenizer, eval_problems, tc.eval_gen_length, t, B)
                rec.update(
                    {
                        "heldout_acc": round(acc, 4),
                        "heldout_nfe": round(nfe, 2),
                        "heldout_acc_threshold": round(acc_t, 4),
                        "heldout_nfe_threshold": round(nfe_t, 2),
                    }
                )
                if tc.family == "llada2":  # LLaDA2.1's decoder: edits above 0.9
                    acc_e, nfe_e = heldout(config, weights, tokenizer, eval_problems, tc.eval_gen_length, t, B, 0.9)
                    rec.update({"heldout_acc_edit": round(acc_e, 4), "heldout_nfe_edit": round(nfe_e, 2)})
                    if not quiet:
                        progress.note(f"  with edits above 0.9: accuracy {acc_e:.3f}, mean NFE {nfe_e:.1f}")
                if not quiet:
                    progress.note(
                        f"step {step}: loss {rec['loss']:.4f}, held-out accuracy {acc:.3f} (one token a step), "
                        f"{acc_t:.3f} (threshold {t}, mean NFE {nfe_t:.1f}), n={len(eval_problems)}"
                    )
            curve.append(rec)
        if not quiet:
            progress.update(step, f"loss {ema:.4f}")
    recorded = dataclasses.replace(tc, init_from=_repo_relative(tc.init_from)) if tc.init_from else tc
    result = {
        "train_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(recorded).items()},
        "n_parameters": n_params,
        "heldout_eval": {
            "n": tc.eval_n,
            "split": "test",
            "seed": 1000 + tc.seed,
            "decoders": f"native policy block, blocks of {tc.block_length}, gen {tc.eval_gen_length}: heldout_acc one "
            "token a step (threshold none), heldout_acc_threshold threshold "
            + ("0.85 (SDAR's dynamic)" if tc.family == "sdar" else "0.95 (LLaDA2.0's)")
            + ("" if tc.family == "sdar" else ", heldout_acc_edit threshold 0.95 and edit_threshold 0.9 (LLaDA2.1's)"),
        },
        "train_time_s": round(time.perf_counter() - t0, 1),
        "torch_version": torch.__version__,
        "curve": curve,
    }
    if out is not None:
        save_run(out, config, weights, tokenizer, result, None if quiet else progress)
    result["weights"] = weights
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/train_toy_llada2.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("llada2", "sdar"), default="llada2", help="the toy's family (default llada2)")
    ap.add_argument("--out", default=None, help="checkpoint folder (default: the family's shipped toy)")
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, tuple) or f.name in ("family", "task"):
            continue
        ap.add_argument("--" + f.name.replace("_", "-"), type=type(value), default=None, help=f"default {value}")
    ap.add_argument(
        "--edit",
        action="store_true",
        help="the editing toy: LLaDA2.1's T2T objective continued from the LLaDA2 toy (EDIT_DEFAULTS; "
        "default --out toy/checkpoint_llada2_edit, --init-from toy/checkpoint_llada2)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if getattr(args, f.name, None) is not None
    }
    if args.edit and args.family != "llada2":
        ap.error("--edit: the editing toy is the LLaDA2 one (--family llada2)")
    edit = {**EDIT_DEFAULTS, "init_from": DEFAULT_OUT} if args.edit else {}
    tc = train_config(args.family, **{**edit, **{k: v for k, v in given.items() if k != "family"}})
    default_out = EDIT_OUT if args.edit else CHECKPOINT_DIRS.get(tc.family, DEFAULT_OUT)
    train(tc, out=args.out or default_out, quiet=args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
