"""Folding identical branch rows (the ``fold_rows`` option): query tokens and time per sample, on and off.

    python benchmarks/bench_fold.py [--models toy,dream,50m] [--n 50] [--gen-length 64]
        [--n-random 10] [--presets blockbatch-paper,blockbatch-best] [--repeats 3] [--threads N]
        [--step-time docs/bench/gpu/bench_gpu_step.json] [--out docs/bench/fold/bench_fold.json]

For each model and preset the same --n prompts (held-out toy problems; on the random model --n-random
prompts of 8..40 random tokens) decode with fold_rows on and with it off, one prompt at a time, the two in turn
(--repeats rounds; a sample's time is its median over the rounds, so machine drift hits both
alike). Each pair is checked first: the tokens and every counter but the query tokens fed must be
equal, or the script stops naming the prompt. Reported per (model, preset): mean query tokens per
sample on and off, mean refresh rows folded per sample, median CPU ms per
sample on and off and the median of the per-sample ratios off / on, and the modelled H200 ms per
sample (each step's query tokens timed by the step-time model of --step-time, docs/bench/gpu).
Writes the JSON and a PNG (query tokens and CPU time per sample, off vs on) next to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from bench_batch import _model, _prompts  # the same models and prompts as the batching benchmark
from common import environment, write_json, write_png

from blockbatch import presets, steptime
from blockbatch.options import DecodeOptions

FED = ("query_tokens_per_step", "folded_rows", "folded_tokens", "wall_ms")


def _engine(name: str):
    if name == "dream":
        from blockbatch.engine import Engine
        from blockbatch.toy import DREAM_CHECKPOINT_DIR

        return Engine.from_pretrained(DREAM_CHECKPOINT_DIR), "dream-toy"
    engine, label = _model(name)  # the toy, a random ~50M LLaDA, or a checkpoint folder
    return engine, "llada-toy" if label == "toy" else label


def measure(engine, prompts, options: DecodeOptions, repeats: int, model: steptime.StepTimeModel) -> dict:
    opts = {True: options, False: options.replace(fold_rows=False)}
    rows = []
    for i, ids in enumerate(prompts):
        times: dict[bool, list[float]] = {True: [], False: []}
        gens = {}
        for _ in range(repeats):
            for fold in (True, False):  # in turn: drift hits both alike
                t0 = time.perf_counter()
                [gens[fold]] = engine.generate([ids], opts[fold])
                times[fold].append((time.perf_counter() - t0) * 1e3)
        on, off = gens[True], gens[False]
        same = {k: v for k, v in on.stats.items() if k not in FED} == {
            k: v for k, v in off.stats.items() if k not in FED
        }
        if on.ids != off.ids or not same:
            raise SystemExit(f"prompt {i}: fold_rows changed the tokens or a counter: {on.stats} vs {off.stats}")
        t_on, t_off = times[True], times[False]
        L = len(ids) + options.gen_length
        rows.append(
            {
                "query_on": sum(on.stats["query_tokens_per_step"]),
                "query_off": sum(off.stats["query_tokens_per_step"]),
                "folded_rows": on.stats["folded_rows"],
                "nfe": on.stats["nfe"],
                "nfe_refresh": on.stats["nfe_refresh"],
                "ms_on": statistics.median(t_on),
                "ms_off": statistics.median(t_off),
                "h200_ms_on": model.decode_seconds(on.stats["query_tokens_per_step"], L) * 1e3,
                "h200_ms_off": model.decode_seconds(off.stats["query_tokens_per_step"], L) * 1e3,
            }
        )
    mean = lambda k: statistics.mean(r[k] for r in rows)  # noqa: E731
    med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
    return {
        "n": len(rows),
        "mean_nfe": mean("nfe"),
        "mean_refreshes": mean("nfe_refresh"),
        "mean_query_tokens_on": mean("query_on"),
        "mean_query_tokens_off": mean("query_off"),
        "query_tokens_saved": 1 - sum(r["query_on"] for r in rows) / sum(r["query_off"] for r in rows),
        "mean_folded_rows": mean("folded_rows"),
        "median_cpu_ms_on": med("ms_on"),
        "median_cpu_ms_off": med("ms_off"),
        "median_cpu_ratio_off_on": statistics.median(r["ms_off"] / r["ms_on"] for r in rows),
        "mean_h200_ms_on": mean("h200_ms_on"),
        "mean_h200_ms_off": mean("h200_ms_off"),
        "samples": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="toy,dream,50m", help="toy (LLaDA toy), dream (Dream toy), 50m, or folders")
    p.add_argument("--n", type=int, default=50, help="prompts per toy model")
    p.add_argument("--n-random", type=int, default=10, help="prompts per random model (50m: slower)")
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--presets", default="blockbatch-paper,blockbatch-best", help="BlockBatch presets to decode with")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds per prompt (the median counts)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (1: the two cores do not interfere)")
    p.add_argument("--step-time", default=os.path.join("docs", "bench", "gpu", "bench_gpu_step.json"))
    p.add_argument("--out", default=os.path.join("docs", "bench", "fold", "bench_fold.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = steptime.load(args.step_time)
    results = {}
    for name in args.models.split(","):
        engine, label = _engine(name)
        n = args.n if label.endswith("toy") else args.n_random
        prompts = _prompts(engine, n)
        for preset in args.presets.split(","):
            o = DecodeOptions(**presets.values(preset, gen_length=args.gen_length))
            print(f"{label} {preset}: {n} prompts x {args.repeats} rounds, fold on / off ...", file=sys.stderr)
            r = measure(engine, prompts, o, args.repeats, model)
            results[f"{label}/{preset}"] = r
            print(
                f"  query tokens {r['mean_query_tokens_off']:.0f} -> {r['mean_query_tokens_on']:.0f} "
                f"(-{100 * r['query_tokens_saved']:.1f}%), {r['mean_folded_rows']:.2f} rows folded per sample, "
                f"CPU ms {r['median_cpu_ms_off']:.1f} -> {r['median_cpu_ms_on']:.1f} "
                f"(x{r['median_cpu_ratio_off_on']:.2f}), H200 ms {r['mean_h200_ms_off']:.2f} -> "
                f"{r['mean_h200_ms_on']:.2f}",
                file=sys.stderr,
            )
    payload = {
        "benchmark": "bench_fold",
        "args": vars(args),
        "environment": environment(),
        "step_time": args.step_time,
        "results": results,
    }
    write_json(args.out, payload)

    def draw(ax):
        names = list(results)
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [results[n]["mean_query_tokens_off"] for n in names], 0.4, label="fold_rows off")
        ax.bar([i + 0.2 for i in x], [results[n]["mean_query_tokens_on"] for n in names], 0.4, label="fold_rows on")
        for i, n in zip(x, names):
            ax.annotate(
                f"CPU x{results[n]['median_cpu_ratio_off_on']:.2f}",
                (i, results[n]["mean_query_tokens_off"]),
                ha="center",
                va="bottom",
                fontsize=6,
            )
        ax.set_xticks(list(x), [n.replace("/", "\n") for n in names], fontsize=6)
        ax.set_ylabel("query tokens per sample")
        ax.set_title("folding identical refresh rows (CPU: median time ratio off / on)", fontsize=8)
        ax.legend(fontsize=7)

    write_png(args.out, draw, size=(7, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
