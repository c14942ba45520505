"""DUET's two parts (policy ``block``; docs/ALGORITHMS.md 18), prefix K/V sparsity (``prefix_kv_budget``) and query
pruning (``query_keep_ratio``), alone and together, against the dense block decode, at long context, on a random
LLaDA2-shaped checkpoint on the CPU.

    python benchmarks/bench_duet.py [--contexts 256 ... 32768] [--decode-contexts 2048 8192] [--budget 256] \\
        [--ratio 0.5] [--masks 24] [--threads 2] [--out docs/bench/duet/bench_duet.json]

Block step: the forward a block's later steps run (one query row of the block's 32 positions, dual mode, over a KV
row of context + 32 positions), dense (every prefix key) against prefix (``budget`` prefix keys, a gathered key
list, and the block's own), query (the block's rows pruned after layer 1, LLaDA2's selection layer: with ``--masks``
masks left, the ``32 - masks`` decided rows and ``ceil(ratio x masks)`` masks go on; the ranking, the LM head on the
masks' hidden state with softmax and top-k, is timed with it) and both, timed with ``torch.ops.blockbatch.forward``
(its ``row_keep`` argument; the fastest of ``--repeats`` interleaved runs, medians beside; a per-layer list set
costs what one list of the same length does). Keys per step: what each reads; rows: the rows the layers after the
selection layer run. Whole decode: ``--decode-contexts`` only (each includes the prompt's prefill): one block of 32
generated positions, one commit a step (threshold 1.0: no probability is above it; steps 32), dense against
``prefix_kv_budget``, ``query_keep_ratio`` and both, with the cost gates off; the wall time includes the prefix
selection at the block's first step and the query ranking of the later ones (the fastest of ``--decode-repeats``
interleaved runs). Writes the JSON and a PNG beside it (block-step time per context).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from typing import Any

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
    weights = random_weights(cfg, seed=0)
    return cfg, NativeModel(cfg, weights), weights["lm_head.weight"]


def block_step(model, head, context: int, budget: int, ratio: float, masks: int, repeats: int) -> dict:
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
    # query pruning: the block's first B - masks rows decided, a random ceil(ratio x masks) of the masks kept
    count = min(masks, max(1, math.ceil(ratio * masks)))
    kept_masks = (B - masks + torch.randperm(masks, generator=g)[:count]).sort().values
    keep = torch.cat([torch.arange(B - masks), kept_masks])
    hidden = torch.randn(masks, head.shape[1], generator=g)

    def rank():  # what the policy's row_keep computes on the host: the LM head on the masks, softmax, top-k
        torch.topk(torch.softmax(torch.nn.functional.linear(hidden, head), -1).max(-1).values, count)

    def dense():
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens)

    def prefix():
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens, None, keys, offsets)

    def query():
        rank()
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens, None, None, None, 1, keep)

    def both():
        rank()
        op(model.obj, ids, pos, cu, kv, rows, None, "dual", None, lens, None, keys, offsets, 1, keep)

    t = interleaved_medians({"dense": dense, "prefix": prefix, "query": query, "both": both}, repeats)
    # the minimum: the machine is shared (other processes' load only ever adds time); medians kept too
    out: dict = {}
    for name in t:
        out[f"{name}_ms"] = t[name]["min_s"] * 1e3
    for name in ("prefix", "query", "both"):
        out[f"{name}_speedup"] = t["dense"]["min_s"] / t[name]["min_s"]
    for name in t:
        out[f"{name}_median_ms"] = t[name]["median_s"] * 1e3
    out["speedup"] = out["prefix_speedup"]
    out.update(dense_keys=context + B, prefix_keys=int(keys.numel()), dense_rows=B, query_rows=int(keep.numel()))
    return out


def whole_decode(model, cfg, context: int, budget: int, ratio: float, repeats: int) -> dict:
    from blockbatch import DecodeOptions
    from blockbatch.decoding import run_decode

    g = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, cfg.eos_token_id, (context,), generator=g)
    base = DecodeOptions(policy="block", gen_length=B, block_length=B, steps=B, threshold=1.0)
    out: dict[str, dict] = {}
    run_decode(model.obj, prompt[: 4 * B], base)  # warm-up (allocator, RoPE table): not the first timed run's cost
    prefix: dict[str, Any] = dict(prefix_kv_budget=budget, prefix_kv_min_context=0)
    query: dict[str, Any] = dict(query_keep_ratio=ratio, query_min_context=0)
    variants = {
        "dense": base,
        "prefix": dataclasses.replace(base, **prefix),
        "query": dataclasses.replace(base, **query),
        "both": dataclasses.replace(base, **prefix, **query),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):  # interleaved; the fastest run counts (the machine is shared)
        for name, o in variants.items():
            r = run_decode(model.obj, prompt, o)
            wall[name].append(r.stats["wall_ms"])
            later = len(r.stats["key_tokens_per_step"]) - 1
            out[name] = dict(
                nfe=r.stats["nfe"],
                keys_per_later_step=statistics.mean(r.stats["key_tokens_per_step"][1:]),
                rows_dropped_per_later_step=r.stats["query_rows_dropped"] / later,
            )
    for name in variants:
        out[name].update(decode_ms=min(wall[name]), decode_runs_ms=wall[name])
    for name in ("prefix", "query", "both"):
        out[f"{name}_speedup"] = out["dense"]["decode_ms"] / out[name]["decode_ms"]
    out["speedup"] = out["prefix_speedup"]
    return out


def plot(out: str, payload: dict) -> None:
    """The PNG beside the JSON: block-step time per context, one line per setting."""
    results = payload["block_step"]

    def draw(ax):
        xs = [int(c) for c in results]
        for name in ("dense", "prefix", "query", "both"):
            ax.plot(xs, [results[str(c)][f"{name}_ms"] for c in xs], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (prompt tokens)")
        ax.set_ylabel("block step (ms)")
        ax.set_title(
            f"DUET block step: budget {payload['budget']}, ratio {payload['query_keep_ratio']}\n"
            f"({payload['step_masks']} masks left; CPU, {payload['environment']['threads']} threads)"
        )
        ax.legend()

    write_png(out, draw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768])
    ap.add_argument("--decode-contexts", type=int, nargs="*", default=[2048, 8192])
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--ratio", type=float, default=0.5, help="query_keep_ratio (the authors' 0.5)")
    ap.add_argument("--masks", type=int, default=24, help="masks left in the timed block step")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--decode-repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/bench/duet/bench_duet.json")
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON at --out")
    args = ap.parse_args()
    if args.plot_only:
        with open(args.out, encoding="utf-8") as f:
            plot(args.out, json.load(f))
        return
    torch.set_num_threads(args.threads)
    cfg, model, head = _model(max(args.contexts + args.decode_contexts) + 2 * B)
    results, decodes = {}, {}
    for ctx in args.contexts:
        results[str(ctx)] = block_step(model, head, ctx, args.budget, args.ratio, args.masks, args.repeats)
        print("step", ctx, results[str(ctx)], flush=True)
    for ctx in args.decode_contexts:
        decodes[str(ctx)] = whole_decode(model, cfg, ctx, args.budget, args.ratio, args.decode_repeats)
        print("decode", ctx, decodes[str(ctx)], flush=True)
    payload = dict(
        environment=environment(),
        model=dict(
            d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, head_dim=32
        ),
        block_length=B,
        budget=args.budget,
        query_keep_ratio=args.ratio,
        query_select_layer=1,
        step_masks=args.masks,
        repeats=args.repeats,
        decode_repeats=args.decode_repeats,
        block_step=results,
        whole_decode=decodes,
    )
    write_json(args.out, payload)
    plot(args.out, payload)


if __name__ == "__main__":
    main()
