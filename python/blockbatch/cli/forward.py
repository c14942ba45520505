"""``blockbatch forward``: load a checkpoint with the strict loader, run one full-canvas native
forward and print logits statistics."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ..engine import DTYPES
from .common import UsageError, parse_ids


def run(args: argparse.Namespace) -> int:
    from ..loading import load_checkpoint
    from ..native import NativeModel

    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.model)
    model = NativeModel.from_checkpoint(ckpt, dtype=DTYPES[args.dtype])
    load_s = time.perf_counter() - t0
    cfg = ckpt.config
    if args.text is not None:
        if ckpt.tokenizer is None:
            raise UsageError(f"{args.model} has no tokenizer.json; pass --ids instead of --text")
        from ..tokenization import TextCodec

        try:
            encoded = TextCodec(ckpt.tokenizer, cfg).encode(args.text, chat=False, allow_unknown=args.allow_unknown)
        except ValueError as e:
            raise UsageError(f"--text: {e}; pass --allow-unknown to run it anyway") from None
        ids = torch.tensor(encoded, dtype=torch.long)
    else:
        ids = torch.tensor(parse_ids(args.ids, "--ids"), dtype=torch.long)
    if ids.numel() == 0:
        raise UsageError("the input is empty")
    if ids.numel() > cfg.max_sequence_length:
        raise UsageError(
            f"the input has {ids.numel()} tokens, more than max_sequence_length = {cfg.max_sequence_length}"
        )
    t0 = time.perf_counter()
    logits = model.forward([ids], [torch.arange(ids.numel())])[0]
    fwd_s = time.perf_counter() - t0
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        nan = int(torch.isnan(logits).sum())
        inf = int(logits.numel() - finite.sum()) - nan
        hint = (
            "float16 overflows on activations this model produces; run with --dtype float32 or --dtype bfloat16"
            if args.dtype == "float16"
            else "the weights may hold NaN / inf, or the activations overflow this dtype; try --dtype float32"
        )
        print(
            f"warning: the logits are not finite ({nan} NaN, {inf} inf of {logits.numel()}): the statistics "
            f"below are meaningless; {hint}",
            file=sys.stderr,
        )
    probs = logits.double().softmax(-1)
    top = probs.max(-1)
    stats = {
        "model": args.model,
        "params": sum(t.numel() for t in ckpt.weights.values()),
        "dtype": args.dtype,
        "layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "heads": cfg.n_heads,
        "kv_heads": cfg.n_kv_heads,
        "vocab": cfg.vocab_size,
        "tokens": ids.numel(),
        "logits_mean": logits.mean().item(),
        "logits_std": logits.std().item(),
        "argmax": top.indices.tolist(),
        "mean_top1_prob": top.values.mean().item(),
        "load_s": load_s,
        "forward_ms": fwd_s * 1e3,
    }
    if args.json:
        print(json.dumps(stats))
    else:
        print(
            f"{args.model}: {stats['params'] / 1e6:.2f}M params, {cfg.n_layers} layers, d={cfg.d_model}, "
            f"heads={cfg.n_heads}/{cfg.n_kv_heads}, vocab={cfg.vocab_size} ({args.dtype}; loaded in {load_s:.2f}s)"
        )
        print(
            f"logits [{ids.numel()}, {cfg.vocab_size}]: mean {stats['logits_mean']:.4f}, std "
            f"{stats['logits_std']:.4f}, mean top-1 probability {stats['mean_top1_prob']:.4f}; "
            f"forward {stats['forward_ms']:.1f} ms"
        )
        if ckpt.tokenizer is not None:
            print("argmax per position:", repr(ckpt.tokenizer.decode(top.indices.tolist(), skip_special_tokens=False)))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "forward",
        help="load a checkpoint and print logits statistics of one native forward",
        description="Load a Hugging Face checkpoint folder (any family: LLaDA, Dream, LLaDA2) with blockbatch's "
        "strict loader, "
        "run one full-canvas native forward and print logits statistics.",
    )
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weight/compute dtype (default float32)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="text to tokenize with the checkpoint's tokenizer")
    src.add_argument("--ids", default="1,2,3,4,5,6,7,8", help="comma-separated token ids (default 1..8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--allow-unknown",
        action="store_true",
        help="with --text: encode characters outside the vocabulary as the unknown token",
    )
    p.set_defaults(func=run)
