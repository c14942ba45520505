"""LLaDA-style SFT of the toy model on the reference forward (CPU, deterministic).

    python tools/train_toy.py [--family llada|dream] [--task arith|parity] [--out DIR] [--steps 3000]
        [--threads 1] [--quiet]

Each step draws a canvas length ``G`` (64 with probability 0.7, 128: 0.2, 256: 0.1) and a
batch of training problems (about 4.7k tokens: 48 rows at G=64); a row is ``prompt + response``
padded with EOS to ``len(prompt) + G``. The prompt is never masked; every response position
(EOS padding included) is masked with probability ``t`` drawn per row (``t ~ U(eps, 1)``,
stratified over the batch), and the loss is the cross-entropy on masked positions weighted
``1/t`` and divided by the row's response length (LLaDA's SFT objective). AdamW, linear warmup
then cosine decay. Every ``eval_every`` steps the held-out accuracy on 64 test problems is
measured with batched vanilla (one token per step) and threshold-0.9 decoding.

``--family dream`` trains the Dream-architecture twin (``toy/checkpoint_dream``): a Qwen2 body
(q/k/v biases, 4 query heads over 2 KV heads, untied ``lm_head``, RoPE theta 1e6) written in the
Hugging Face Dream layout, same tokenizer, data and objective, except for Dream's shift: the
loss of a masked canvas position ``p`` is read from the model's output at ``p - 1`` (output ``i``
predicts token ``i + 1``; the prompt is never empty, so ``p - 1`` always exists), and the
held-out decoding reads its logits the same way. Its run is 2,500 steps (24.6 minutes on one core
with the other one busy). The LLaDA path is unchanged by the option: the default run still
reproduces the shipped LLaDA checkpoint bit for bit.

Everything is seeded and the thread count is fixed (1 by default, so a busy second core does not
slow it down), so a run reproduces the shipped checkpoint bit for bit on the same software
stack; ``learning_curve.json`` records the sha256 of ``model.safetensors`` to compare. The
default run takes about 22 minutes on one core of a 2-core Xeon. The checkpoint folder gets
``config.json``, ``model.safetensors``, ``tokenizer.json`` and ``learning_curve.json`` (Dream:
``generation_config.json`` too).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

from blockbatch.config import ModelConfig
from blockbatch.families.dream import PREFIX as DREAM_PREFIX
from blockbatch.families.llada import PREFIX
from blockbatch.loading import WEIGHTS_NAME, expected_weight_shapes, save_checkpoint
from blockbatch.reference.model import ReferenceModel
from blockbatch.toy import CHECKPOINT_DIRS
from blockbatch.toy import parity as parity_task
from blockbatch.toy import task as toy_task
from blockbatch.toy import tokenizer as toy_tok

FAMILIES = ("llada", "dream")
DEFAULT_OUT = CHECKPOINT_DIRS["llada"]
CURVE_NAME = "learning_curve.json"


@dataclasses.dataclass
class TrainConfig:
    family: str = "llada"  # "llada" or "dream": architecture, layout and whether the outputs are shifted
    task: str = "arith"  # "arith" (blockbatch.toy.task, the shipped toys) or "parity" (blockbatch.toy.parity)
    # model
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    mlp_hidden_size: int = 384
    rope_theta: float = 10000.0
    max_sequence_length: int = 512
    # optimisation
    steps: int = 3000
    tokens_per_step: int = 4656  # rows per step = tokens_per_step // row length (48 at G=64)
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    eps: float = 1e-3  # t ~ U(eps, 1)
    canvas_lengths: tuple[int, ...] = (64, 128, 256)
    canvas_weights: tuple[float, ...] = (0.7, 0.2, 0.1)
    seed: int = 0
    threads: int = 1  # fixed: results depend on it, and 1 thread is immune to a busy second core
    # monitoring
    log_every: int = 25
    eval_every: int = 500
    eval_n: int = 64
    eval_gen_length: int = 64
    eval_block_length: int = 32


# What ``--family dream`` changes besides the family (anything can still be overridden): GQA,
# Dream's published RoPE base, and fewer steps so that the run fits in 25 minutes on one core.
TASKS = {"arith": toy_task, "parity": parity_task}  # the task modules (one interface)
FAMILY_DEFAULTS: dict[str, dict] = {"llada": {}, "dream": {"n_kv_heads": 2, "rope_theta": 1000000.0, "steps": 2500}}


def train_config(family: str = "llada", **overrides) -> TrainConfig:
    """``TrainConfig`` with the defaults of ``family`` (``FAMILY_DEFAULTS``), then ``overrides``."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    tc = TrainConfig(family=family, **{**FAMILY_DEFAULTS[family], **overrides})
    if tc.task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {tc.task!r}")
    return tc


def model_config(tc: TrainConfig) -> ModelConfig:
    if tc.family == "dream":
        # Dream's convention is bos == eos == pad (<|endoftext|>). The toy tokenizer has its own pad
        # token, which stays the pad id (as for the LLaDA toy); <|endoftext|> doubles as BOS, as in
        # Dream (the toy task never prepends one).
        return ModelConfig(
            d_model=tc.d_model,
            n_layers=tc.n_layers,
            n_heads=tc.n_heads,
            n_kv_heads=tc.n_kv_heads,
            mlp_hidden_size=tc.mlp_hidden_size,
            vocab_size=toy_tok.VOCAB_SIZE,
            embedding_size=toy_tok.VOCAB_SIZE,
            rope_theta=tc.rope_theta,
            rms_norm_eps=1e-6,
            weight_tying=False,
            mask_token_id=toy_tok.MASK_ID,
            eos_token_id=toy_tok.EOS_ID,
            max_sequence_length=tc.max_sequence_length,
            model_type="Dream",
            pad_token_id=toy_tok.PAD_ID,
            bos_token_id=toy_tok.EOS_ID,
            attention_bias=True,
        ).validate()
    if tc.family != "llada":
        raise ValueError(f"family must be one of {FAMILIES}, got {tc.family!r}")
    return ModelConfig(
        d_model=tc.d_model,
        n_layers=tc.n_layers,
        n_heads=tc.n_heads,
        n_kv_heads=tc.n_kv_heads,
        mlp_hidden_size=tc.mlp_hidden_size,
        vocab_size=toy_tok.VOCAB_SIZE,
        embedding_size=toy_tok.VOCAB_SIZE,
        rope_theta=tc.rope_theta,
        rms_norm_eps=1e-5,
        weight_tying=False,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        max_sequence_length=tc.max_sequence_length,
        pad_token_id=toy_tok.PAD_ID,
    ).validate()


def init_weights(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """GPT-2 style init: N(0, 1) embeddings, 1/sqrt(fan_in) projections, residual outputs
    scaled by 1/sqrt(2 * n_layers), LM head scaled by 0.1, unit norms (Dream: zero q/k/v biases).
    Returns leaf float32 tensors with requires_grad."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    if config.family == "dream":
        for name, shape in expected_weight_shapes(config).items():
            if name.endswith(".bias"):
                t = torch.zeros(shape)
            elif len(shape) == 1:
                t = torch.ones(shape)
            elif name == DREAM_PREFIX + "embed_tokens.weight":
                t = torch.randn(shape, generator=g)
            else:
                t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
                if name.endswith(".o_proj.weight") or name.endswith(".down_proj.weight"):
                    t = t / math.sqrt(2 * config.n_layers)
                elif name == "lm_head.weight":
                    t = t * 0.1
            out[name] = t.requires_grad_(True)
        return out
    for name, shape in expected_weight_shapes(config).items():
        if len(shape) == 1:
            t = torch.ones(shape)
        elif name.endswith("wte.weight"):
            t = torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            if name.endswith(".attn_out.weight") or (name.endswith(".ff_out.weight") and ".blocks." in name):
                t = t / math.sqrt(2 * config.n_layers)
            elif name == PREFIX + "ff_out.weight":
                t = t * 0.1
        out[name] = t.requires_grad_(True)
    return out


# --------------------------------------------------------------------------- data


def encode_problem(tokenizer, problem: toy_task.Problem) -> tuple[list[int], list[int]]:
    return toy_tok.encode(tokenizer, problem.prompt), toy_tok.encode(tokenizer, problem.response)


def make_batch(tokenizer, problems: list[toy_task.Problem], canvas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids ``[B, T]`` (prompt + response + EOS padding, ``T = max prompt + canvas``) and a bool
    ``[B, T]`` mask of the response region (everything after the prompt)."""
    enc = [encode_problem(tokenizer, p) for p in problems]
    lp_max = max(len(p) for p, _ in enc)
    T = lp_max + canvas
    ids = torch.full((len(enc), T), toy_tok.EOS_ID, dtype=torch.long)
    resp = torch.zeros((len(enc), T), dtype=torch.bool)
    for b, (p, r) in enumerate(enc):
        if len(r) >= T - len(p):
            raise ValueError(f"response of {len(r)} tokens does not fit in a canvas of {T - len(p)}")
        ids[b, : len(p)] = torch.tensor(p)
        ids[b, len(p) : len(p) + len(r)] = torch.tensor(r)
        resp[b, len(p) :] = True
    return ids, resp


def shift_batch(logits: torch.Tensor) -> torch.Tensor:
    """Dream's shift over ``[B, T, V]`` logits: position ``i`` takes output ``i - 1`` (position 0 its
    own, never read: it is a prompt position). Row by row the same as ``reference.dream.shift_rows``."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def diffusion_loss(
    model: ReferenceModel, ids: torch.Tensor, resp: torch.Tensor, g: torch.Generator, eps: float = 1e-3
) -> torch.Tensor:
    """LLaDA SFT loss: mask response tokens with prob t per row, CE on masked / t / response length.

    For a Dream model (``config.shifted_logits``) the prediction of position ``p`` is the output
    at ``p - 1``; the masking and the weighting are the same.
    """
    B = ids.shape[0]
    u = torch.rand((), generator=g)
    t = ((u + torch.arange(B) / B) % 1.0) * (1 - eps) + eps  # stratified t ~ U(eps, 1)
    masked = (torch.rand(ids.shape, generator=g) < t[:, None]) & resp
    noisy = torch.where(masked, torch.full_like(ids, model.config.mask_token_id), ids)
    logits = model.forward_batch(noisy)
    if model.config.shifted_logits:
        logits = shift_batch(logits)
    ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1), reduction="none").view(ids.shape)
    per_row = (ce * masked).sum(1) / t / resp.sum(1)
    return per_row.mean()


# --------------------------------------------------------------------------- batched decoding


@torch.no_grad()
def batched_decode(
    model: ReferenceModel, prompts: list[list[int]], gen_length: int, block_length: int, threshold: float | None
) -> tuple[list[list[int]], float]:
    """Decode many prompts at once (rows grouped by prompt length) with a full forward each step.

    Same rules as the reference policies with ``policy="vanilla"``: blocks left to right; in the
    current block commit the argmax at the most confident masked position, plus (``threshold``)
    every masked position with confidence >= threshold. Returns generated ids and mean NFE.
    Used for the quick held-out accuracy of the learning curve. A Dream model's logits are
    shifted (position ``p`` reads output ``p - 1``, as in Dream's full forwards). The mask id is
    never proposed (committing it would never finish the block).
    """
    cfg = model.config
    out: list[list[int] | None] = [None] * len(prompts)
    nfe_total = 0
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(len(p), []).append(i)
    for lp, rows in groups.items():
        x = torch.full((len(rows), lp + gen_length), cfg.mask_token_id, dtype=torch.long)
        x[:, :lp] = torch.tensor([prompts[i] for i in rows])
        block = torch.zeros(len(rows), dtype=torch.long)
        nblocks = gen_length // block_length
        nfe = torch.zeros(len(rows), dtype=torch.long)
        while True:
            # advance rows whose current block is complete
            for r in range(len(rows)):
                while block[r] < nblocks:
                    s = lp + int(block[r]) * block_length
                    if bool((x[r, s : s + block_length] == cfg.mask_token_id).any()):
                        break
                    block[r] += 1
            active = (block < nblocks).nonzero().flatten()
            if len(active) == 0:
                break
            logits = model.forward_batch(x[active]).double()
            if cfg.shifted_logits:
                logits = shift_batch(logits)
            probs = torch.softmax(logits, -1)
            conf, x0 = probs.index_fill(-1, torch.tensor([cfg.mask_token_id]), -1.0).max(-1)
            for j, r in enumerate(active.tolist()):
                s = lp + int(block[r]) * block_length
                e = s + block_length
                c = conf[j, s:e].clone()
                cand = x[r, s:e] == cfg.mask_token_id
                c[~cand] = -math.inf
                chosen = torch.zeros_like(cand)
                if threshold is not None:
                    chosen = c >= threshold
                chosen[int(torch.argmax(c))] = True
                chosen &= cand
                x[r, s:e][chosen] = x0[j, s:e][chosen]
                nfe[r] += 1
        for j, i in enumerate(rows):
            out[i] = x[j, lp:].tolist()
        nfe_total += int(nfe.sum())
    return out, nfe_total / max(1, len(prompts))


def quick_accuracy(
    model: ReferenceModel,
    tokenizer,
    problems,
    gen_length: int,
    block_length: int,
    threshold: float | None,
    check=toy_task.check_answer,
) -> tuple[float, float]:
    prompts = [toy_tok.encode(tokenizer, p.prompt) for p in problems]
    gens, nfe = batched_decode(model, prompts, gen_length, block_length, threshold)
    ok = sum(check(p, toy_tok.decode_response(tokenizer, g)) for p, g in zip(problems, gens))
    return ok / len(problems), nfe


# --------------------------------------------------------------------------- training


class Progress:
    """One status line, redrawn in place on a terminal, printed every ``every`` steps otherwise."""

    def __init__(self, total: int, every: int, stream=sys.stderr):
        self.total, self.every, self.stream = total, every, stream
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def update(self, step: int, msg: str) -> None:
        if not self.tty and step % self.every and step != self.total:
            return
        el = time.perf_counter() - self.start
        eta = el / max(step, 1) * (self.total - step)
        width = 24
        fill = int(width * step / self.total)
        line = (
            f"[{'#' * fill}{'.' * (width - fill)}] {step}/{self.total} {msg} "
            f"{el / 60:4.1f}m elapsed, ETA {eta / 60:4.1f}m"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, msg: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
        self.stream.write(msg + "\n")
        self.stream.flush()


def lr_at(tc: TrainConfig, step: int) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    frac = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def train(tc: TrainConfig, out: str | None = None, quiet: bool = False) -> dict:
    """Train; write the checkpoint to ``out`` (if given). Returns the learning-curve dict."""
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    config = model_config(tc)
    tokenizer = toy_tok.build_tokenizer()
    weights = init_weights(config, tc.seed)
    model = ReferenceModel(config, weights)
    opt = make_optimizer(
        tc, [w for w in weights.values() if w.dim() == 2], [w for w in weights.values() if w.dim() < 2]
    )
    g, rng, stream, eval_problems = data_streams(tc)
    n_params = sum(w.numel() for w in weights.values())

    curve: list[dict] = []
    progress = Progress(tc.steps, tc.log_every)
    if not quiet:
        progress.note(
            f"toy {tc.family} model: {n_params / 1e6:.2f}M parameters, {tc.steps} steps, {tc.threads} threads"
        )
    running, running_n = 0.0, 0
    t0 = time.perf_counter()
    for step in range(1, tc.steps + 1):
        canvas = rng.choices(tc.canvas_lengths, weights=tc.canvas_weights)[0]
        rows = max(1, tc.tokens_per_step // (TASKS[tc.task].PROMPT_CHARS + canvas))
        problems = [next(stream) for _ in range(rows)]
        ids, resp = make_batch(tokenizer, problems, canvas)
        for group in opt.param_groups:
            group["lr"] = lr_at(tc, step - 1)
        loss = diffusion_loss(model, ids, resp, g, tc.eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(weights.values()), tc.grad_clip)
        opt.step()
        value = loss.item()
        running += value
        running_n += 1
        ema = value if step == 1 else 0.95 * ema + 0.05 * value  # noqa: F821 (set at step 1)
        if step % tc.log_every == 0 or step == tc.steps:
            rec = {"step": step, "loss": round(running / running_n, 5), "elapsed_s": round(time.perf_counter() - t0, 1)}
            running, running_n = 0.0, 0
            if tc.eval_every and (step % tc.eval_every == 0 or step == tc.steps):
                check = TASKS[tc.task].check_answer
                acc, _ = quick_accuracy(
                    model, tokenizer, eval_problems, tc.eval_gen_length, tc.eval_block_length, None, check
                )
                acc_t, nfe_t = quick_accuracy(
                    model, tokenizer, eval_problems, tc.eval_gen_length, tc.eval_block_length, 0.9, check
                )
                rec.update(
                    {
                        "heldout_acc": round(acc, 4),
                        "heldout_acc_threshold": round(acc_t, 4),
                        "heldout_nfe_threshold": round(nfe_t, 2),
                    }
                )
                if not quiet:
                    progress.note(
                        f"step {step}: loss {rec['loss']:.4f}, held-out accuracy {acc:.3f} "
                        f"(vanilla), {acc_t:.3f} (threshold 0.9, mean NFE {nfe_t:.1f}), "
                        f"n={len(eval_problems)}"
                    )
            curve.append(rec)
        if not quiet:
            progress.update(step, f"loss {ema:.4f}")
    if not quiet:
        progress.note(f"done in {(time.perf_counter() - t0) / 60:.1f} min")

    result = {
        "train_config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(tc).items()},
        "n_parameters": n_params,
        "heldout_eval": {
            "n": tc.eval_n,
            "split": "test",
            "seed": 1000 + tc.seed,
            "decoders": f"heldout_acc: vanilla (1 token/step); heldout_acc_threshold: threshold 0.9; "
            f"gen {tc.eval_gen_length}, block {tc.eval_block_length}, batched full forwards"
            + ("; Dream shift (position p read from output p - 1)" if config.shifted_logits else ""),
        },
        "train_time_s": round(time.perf_counter() - t0, 1),
        "torch_version": torch.__version__,
        "curve": curve,
    }
    if out is not None:
        save_run(out, config, weights, tokenizer, result, None if quiet else progress)
    result["weights"] = weights
    return result


def make_optimizer(tc, decay: list, no_decay: list) -> torch.optim.AdamW:
    """AdamW of the toy runs: weight decay on `decay` only."""
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )


def data_streams(tc):
    """The run's seeded sources: the masking generator, the canvas-length RNG, the training problems
    and the held-out ones."""
    g = torch.Generator().manual_seed(tc.seed + 1)
    rng = random.Random(tc.seed + 2)
    task = TASKS[tc.task]
    stream = task.iter_problems(tc.seed, "train")
    eval_problems = task.make_problems(tc.eval_n, seed=1000 + tc.seed, split="test")
    return g, rng, stream, eval_problems


def save_run(out: str, config: ModelConfig, weights: dict, tokenizer, result: dict, progress=None) -> None:
    """The checkpoint folder of a run: weights (mode 0644: the file ships), tokenizer, and the
    learning curve with the weights' sha256 (set in `result` too)."""
    save_checkpoint(out, config, {k: v.detach() for k, v in weights.items()}, tokenizer=tokenizer)
    os.chmod(os.path.join(out, WEIGHTS_NAME), 0o644)  # safetensors writes 0600; the file ships
    with open(os.path.join(out, WEIGHTS_NAME), "rb") as f:
        result["model_sha256"] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, CURVE_NAME), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    if progress is not None:
        progress.note(f"wrote {out} (model.safetensors sha256 {result['model_sha256'][:16]}...)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/train_toy.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--family",
        choices=FAMILIES,
        default="llada",
        help="llada (default; the shipped toy/checkpoint) or dream (toy/checkpoint_dream: Dream layout, "
        f"shifted outputs; changes the defaults {FAMILY_DEFAULTS['dream']})",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="checkpoint folder (default: the shipped toy/checkpoint, or toy/checkpoint_dream with --family dream)",
    )
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        value = getattr(defaults, f.name)
        if isinstance(value, tuple) or f.name in ("family", "task"):
            continue
        # None: not given, the family's default applies (train_config)
        ap.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(value),
            default=None,
            help=f"default {value}"
            + (f" ({FAMILY_DEFAULTS['dream'][f.name]} for dream)" if f.name in FAMILY_DEFAULTS["dream"] else ""),
        )
    ap.add_argument(
        "--task",
        choices=list(TASKS),
        default="arith",
        help="arith (default: the shipped toys' chained arithmetic) or parity (blockbatch.toy.parity: running "
        "parity of 8..16 bits, another skill; give --out, no parity checkpoint ships)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.task != "arith" and args.out is None:
        ap.error(f"--task {args.task} needs --out DIR (the shipped checkpoints are the arith task's)")
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(TrainConfig)
        if f.name not in ("family", "task") and getattr(args, f.name, None) is not None
    }
    tc = train_config(args.family, task=args.task, **given)
    train(tc, out=args.out or CHECKPOINT_DIRS[args.family], quiet=args.quiet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
