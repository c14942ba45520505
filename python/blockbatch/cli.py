"""``blockbatch`` command line.

    blockbatch forward --model DIR          load a checkpoint, run one native forward, print logits stats
    blockbatch make-random DIR [--seed N]   write a random LLaDA checkpoint (for trying things out)

Run ``blockbatch COMMAND --help`` for every option.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cmd_forward(args: argparse.Namespace) -> int:
    from .loading import load_checkpoint
    from .native import NativeModel

    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.model)
    model = NativeModel.from_checkpoint(ckpt, dtype=DTYPES[args.dtype])
    load_s = time.perf_counter() - t0
    cfg = ckpt.config
    if args.text is not None:
        if ckpt.tokenizer is None:
            print(f"error: {args.model} has no tokenizer.json; pass --ids instead of --text", file=sys.stderr)
            return 2
        ids = torch.tensor(ckpt.tokenizer.encode(args.text).ids, dtype=torch.long)
    else:
        ids = torch.tensor([int(x) for x in args.ids.split(",")], dtype=torch.long)
    if ids.numel() == 0:
        print("error: the input is empty", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    logits = model.forward([ids], [torch.arange(ids.numel())])[0]
    fwd_s = time.perf_counter() - t0
    probs = logits.double().softmax(-1)
    top = probs.max(-1)
    stats = {
        "model": args.model, "params": sum(t.numel() for t in ckpt.weights.values()), "dtype": args.dtype,
        "layers": cfg.n_layers, "d_model": cfg.d_model, "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads,
        "vocab": cfg.vocab_size, "tokens": ids.numel(), "logits_mean": logits.mean().item(),
        "logits_std": logits.std().item(), "argmax": top.indices.tolist(),
        "mean_top1_prob": top.values.mean().item(), "load_s": load_s, "forward_ms": fwd_s * 1e3,
    }
    if args.json:
        print(json.dumps(stats))
    else:
        print(f"{args.model}: {stats['params'] / 1e6:.2f}M params, {cfg.n_layers} layers, d={cfg.d_model}, "
              f"heads={cfg.n_heads}/{cfg.n_kv_heads}, vocab={cfg.vocab_size} ({args.dtype}; loaded in {load_s:.2f}s)")
        print(f"logits [{ids.numel()}, {cfg.vocab_size}]: mean {stats['logits_mean']:.4f}, std "
              f"{stats['logits_std']:.4f}, mean top-1 probability {stats['mean_top1_prob']:.4f}; "
              f"forward {stats['forward_ms']:.1f} ms")
        if ckpt.tokenizer is not None:
            print("argmax per position:", repr(ckpt.tokenizer.decode(top.indices.tolist(), skip_special_tokens=False)))
    return 0


def _cmd_make_random(args: argparse.Namespace) -> int:
    from .testing import make_random_checkpoint

    config = make_random_checkpoint(args.out, seed=args.seed, dtype=DTYPES[args.dtype], logit_scale=args.logit_scale,
                                    d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                    n_kv_heads=args.kv_heads or args.heads, mlp_hidden_size=args.mlp,
                                    vocab_size=args.vocab)
    print(f"wrote a random LLaDA checkpoint to {args.out} (d_model={config.d_model}, layers={config.n_layers}, "
          f"vocab={config.vocab_size}, mask id {config.mask_token_id}, eos id {config.eos_token_id})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blockbatch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("forward", help="load a checkpoint and print logits statistics of one native forward",
                       description="Load a Hugging Face LLaDA checkpoint folder with blockbatch's strict loader, "
                                   "run one full-canvas native forward and print logits statistics.")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weight/compute dtype (default float32)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="text to tokenize with the checkpoint's tokenizer")
    src.add_argument("--ids", default="1,2,3,4,5,6,7,8", help="comma-separated token ids (default 1..8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_cmd_forward)

    p = sub.add_parser("make-random", help="write a random LLaDA checkpoint folder",
                       description="Write a checkpoint with random weights in the exact HF LLaDA layout.")
    p.add_argument("out", help="folder to create")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=list(DTYPES), default="float32")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads (no GQA)")
    p.add_argument("--mlp", type=int, default=256)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--logit-scale", type=float, default=1.0, help="LM-head scale (sharper softmax when larger)")
    p.set_defaults(func=_cmd_make_random)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, RuntimeError) as e:  # CheckpointError, TORCH_CHECK: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
