"""DUET's prefix K/V sparsity (policy ``block``, ``prefix_kv_budget``; docs/ALGORITHMS.md 18) against the dense
block decode, at long context, on a random LLaDA2-shaped checkpoint on the CPU.

    python benchmarks/bench_duet.py [--contexts 256 ... 32768] [--decode-contexts 2048 8192] [--budget 256] \\
        [--threads 2] [--out docs/bench/duet/bench_duet.json]

Block step: the forward a block's later steps run (one query row of the block's 32 positions, dual mode, over
a KV row of context + 32 positions), dense (every prefix key) against prefix (``budget`` prefix keys, a gathered
key list, and the block's own), timed with ``torch.ops.blockbatch.forward`` (the fastest of ``--repeats``
interleaved runs, medians beside; a per-layer list set costs what one list of the same length does). Keys per
step: what each reads. Whole decode: ``--decode-contexts`` only (each includes the prompt's prefill): one
block of 32 generated positions, one commit a step (threshold 1.0: no probability is above it; steps 32),
dense against ``prefix_kv_budget`` with the cost gate off; the wall time includes the selection at the block's
first step. Query pruning
(``query_keep_ratio``) is not in the native policy yet: its rows are absent.
Writes the JSON and a PNG beside it (block-step time per context).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from common import environment, interleaved_medians, write_json, write_png

B = 32


def _model(max_len: int):
    from blockbatch.native import NativeModel
    from blockbatch.random_checkpoint import random_config, random_weights

    # the toy's LLaDA2 shape scaled up: GQA 8/2 heads of 32 dims, QK-norm, partial RoPE, MoE layers
    cfg = random_config(
        "llada2",
        d_model=256,
        n_layers=4,
        n_heads=8,
        n_kv_heads=2,
        head_size=32,
        mlp_hidden_size=512,
        moe_hidden_size=128,
        vocab_size=512,
        max_sequence_length=max_len,
    )
    return cfg, NativeModel(cfg, random_weights(cfg, seed=0))


def block_step(model, context: int, budget: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(context)
    ids = torch.randint(0, 500, (B,), generator=g)
    pos = torch.arange(context, context + B)
    cu = torch.tensor([0, B])
    kv = model.new_kv(1, context + B)
    rows, lens = torch.zeros(1, dtype=torch.long), torch.tensor([context + B])
    chosen = torch.randperm(context, generator=g)[: min(budget, context)].sort().values
    keys = torch.cat([chosen, pos])
    offsets = torch.tensor([0, keys.numel()])
    op = torch.ops.blockbatch.forward

    def dense():
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens)

    def prefix():
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens, None, keys, offsets)

    t = interleaved_medians({"dense": dense, "prefix": prefix}, repeats)
    # the minimum: the machine is shared (other processes' load only ever adds time); medians kept too
    return dict(
        dense_ms=t["dense"]["min_s"] * 1e3,
        prefix_ms=t["prefix"]["min_s"] * 1e3,
        speedup=t["dense"]["min_s"] / t["prefix"]["min_s"],
        dense_median_ms=t["dense"]["median_s"] * 1e3,
        prefix_median_ms=t["prefix"]["median_s"] * 1e3,
        dense_keys=context + B,
        prefix_keys=int(keys.numel()),
    )


def whole_decode(model, cfg, context: int, budget: int) -> dict:
    from blockbatch import DecodeOptions
    from blockbatch.decoding import run_decode

    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, cfg.eos_token_id, (context,), generator=g)
    base = DecodeOptions(policy="block", gen_length=B, block_length=B, steps=B, threshold=1.0)
    out: dict[str, dict] = {}
    for name, o in {
        "dense": base,
        "prefix": dataclasses.replace(base, prefix_kv_budget=budget, prefix_kv_min_context=0),
    }.items():
        r = run_decode(model.obj, prompt, o)
        out[name] = dict(
            decode_ms=r.stats["wall_ms"],
            nfe=r.stats["nfe"],
            keys_per_later_step=statistics.mean(r.stats["key_tokens_per_step"][1:]),
        )
    out["speedup"] = out["dense"]["decode_ms"] / out["prefix"]["decode_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--decode-contexts", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/bench/duet/bench_duet.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, model = _model(max(args.contexts + args.decode_contexts) + 2 * B)
    results, decodes = {}, {}
    for ctx in args.contexts:
        results[str(ctx)] = block_step(model, ctx, args.budget, args.repeats)
        print("step", ctx, results[str(ctx)], flush=True)
    for ctx in args.decode_contexts:
        decodes[str(ctx)] = whole_decode(model, cfg, ctx, args.budget)
        print("decode", ctx, decodes[str(ctx)], flush=True)
    payload = dict(
        environment=environment(),
        model=dict(
            d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=32
        ),
        block_length=B,
        budget=args.budget,
        repeats=args.repeats,
        block_step=results,
        whole_decode=decodes,
    )
    write_json(args.out, payload)

    def draw(ax):
        xs = [int(c) for c in results]
        for name in ("dense", "prefix"):
            ax.plot(xs, [results[str(c)][f"{name}_ms"] for c in xs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel("block step (ms)")
        ax.set_title(f"DUET prefix K/V, budget {args.budget} (CPU, {args.threads} threads)")
        ax.legend()

    write_png(args.out, draw)


if __name__ == "__main__":
    main()
