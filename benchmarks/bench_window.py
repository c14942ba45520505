"""Window-Diffusion (policy ``window``) against vanilla, dual cache and BlockBatch on a toy (LLaDA or Dream).

    python benchmarks/bench_window.py [--family llada|dream] [--n 40] [--gen-lengths 64 256] \\
        [--threads 2] [--out docs/bench/window/bench_window.json]

Per generation length and policy (each policy's ``bench_options``: vanilla one token per step,
dual block 32 / threshold 0.9, BlockBatch's defaults, window the authors' settings at one token per
step: active 16, refresh 32, the family's window: LLaDA 64, Dream 127 with its sliding span), on the
toy task's held-out problems, interleaved per problem: accuracy (exact match of the final answer),
mean NFE, mean query tokens per forward, mean key tokens per forward (the decode's
``key_tokens_per_step``: a full forward its own tokens, a cached one the cache rows it reads; window:
the window at a pruned forward), mean wall ms per sample. Then batched throughput: the same problems
through ``Engine.generate(max_batch=8)``, generated tokens per second. Writes the JSON and a PNG
beside it (time per sample).
"""

from __future__ import annotations

import argparse
import os
import dataclasses
import statistics
import time

import torch

from common import environment, write_json, write_png

POLICIES = ("vanilla", "dual", "blockbatch", "window")
KEPT = (
    "policy",
    "steps",
    "block_length",
    "threshold",
    "block_sizes",
    "window_tokens",
    "active_tokens",
    "refresh_interval",
)
BATCH = 8


def run(engine, samples, gen_length: int) -> dict:
    from blockbatch import bench, tasks

    options = {name: bench.policy_options(name, gen_length) for name in POLICIES}
    rows: dict[str, list[dict]] = {name: [] for name in POLICIES}
    prompts = [tasks.encode(engine, s) for s in samples]
    for sample, ids in zip(samples, prompts):
        for name, o in options.items():
            t0 = time.perf_counter()
            [gen] = engine.generate(ids, o)
            ms = (time.perf_counter() - t0) * 1e3
            s = gen.stats
            queries = sum(s["query_tokens_per_step"])
            keys = sum(s["key_tokens_per_step"])
            rows[name].append(
                dict(
                    correct=bool(sample.check(gen)),
                    nfe=s["nfe"],
                    queries=queries,
                    keys=keys,
                    ms=ms,
                    tokens=len(gen.ids),
                )
            )
    out = {}
    for name, rs in rows.items():
        nfe = sum(r["nfe"] for r in rs)
        out[name] = dict(
            options={k: v for k, v in dataclasses.asdict(options[name]).items() if k in KEPT},
            accuracy=sum(r["correct"] for r in rs) / len(rs),
            mean_nfe=statistics.mean(r["nfe"] for r in rs),
            query_tokens_per_forward=sum(r["queries"] for r in rs) / nfe,
            key_tokens_per_forward=sum(r["keys"] for r in rs) / nfe,
            mean_ms=statistics.mean(r["ms"] for r in rs),
        )
        t0 = time.perf_counter()
        gens = engine.generate(prompts, [options[name]] * len(prompts), max_batch=BATCH)
        out[name]["batched_tokens_per_s"] = sum(len(g.ids) for g in gens) / (time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--family", default="llada", help="the toy to decode: a family with a window decoder (default llada)"
    )
    ap.add_argument("--n", type=int, default=40, help="held-out problems (default 40)")
    ap.add_argument("--gen-lengths", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="default docs/bench/window/bench_window[_dream].json")
    args = ap.parse_args(argv)
    from blockbatch import families

    windowed = [name for name, family in families.REGISTRY.items() if "window" in family.POLICIES]
    if args.family not in windowed:
        ap.error(f"--family: the toys with a window decoder are {', '.join(windowed)}, got {args.family!r}")
    if args.out is None:
        suffix = "" if args.family == "llada" else "_" + args.family
        args.out = f"docs/bench/window/bench_window{suffix}.json"
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import bench
    from blockbatch.engine import Engine
    from blockbatch.toy import checkpoint_path

    engine = Engine.from_pretrained(checkpoint_path(args.family))
    samples = bench.load_tasks(None, args.n)
    results = {}
    for G in args.gen_lengths:
        results[str(G)] = run(engine, samples, G)
        print(f"gen_length {G}:")
        for name, r in results[str(G)].items():
            keys = "-" if r["key_tokens_per_forward"] is None else f"{r['key_tokens_per_forward']:.1f}"
            queries = r["query_tokens_per_forward"]
            print(
                f"  {name:10s} acc {r['accuracy']:.3f}  NFE {r['mean_nfe']:6.1f}  q/fwd {queries:6.1f}"
                f"  k/fwd {keys:>6s}  {r['mean_ms']:7.1f} ms  batched {r['batched_tokens_per_s']:7.1f} tok/s"
            )
    payload = dict(
        benchmark="bench_window",
        model=f"{args.family} toy (python/blockbatch/toy/{os.path.basename(checkpoint_path(args.family))})",
        family=args.family,
        problems=args.n,
        batch=BATCH,
        environment=environment(),
        results=results,
    )
    write_json(args.out, payload)

    def draw(ax):
        width = 0.8 / len(POLICIES)
        Gs = list(results)
        for j, name in enumerate(POLICIES):
            xs = [i + j * width for i in range(len(Gs))]
            ax.bar(xs, [results[G][name]["mean_ms"] for G in Gs], width, label=name)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(Gs))], [f"gen {G}" for G in Gs])
        ax.set_ylabel("ms per sample (CPU, alone)")
        ax.set_title(f"{args.family} toy: time per sample")
        ax.legend()

    write_png(args.out, draw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
