"""SDAR's unmasking rules on the shipped SDAR toy (toy/checkpoint_sdar), CPU, float32: per rule, the held-out
accuracy, the NFE (the authors' count: prefill + denoising + one store a block; and the forwards the engine
runs, the stores and prefill folded into the next forward), and the time per sample, native; every answer
decoded by the float32 reference too (reference/sdar.py), its tokens and NFE asserted equal.

    python benchmarks/bench_sdar.py [--n 200] [--gen-length 64] [--threads 1] \
        [--out docs/bench/sdar/bench_sdar.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from common import environment, write_json, write_png

# (label, options): the authors' defaults first, then each rule, a larger block, a looser threshold.
RULES = [
    ("dynamic 0.85, block 4", dict(block_length=4, unmasking="dynamic", threshold=0.85)),
    ("dynamic 0.6, block 4", dict(block_length=4, unmasking="dynamic", threshold=0.6)),
    ("dynamic 0.85, block 8", dict(block_length=8, unmasking="dynamic", threshold=0.85)),
    ("dynamic 0.85, block 16", dict(block_length=16, unmasking="dynamic", threshold=0.85)),
    ("static, block 4", dict(block_length=4, unmasking="static")),
    ("static, block 4, 2 steps", dict(block_length=4, unmasking="static", steps=2)),
    ("sequential, block 4", dict(block_length=4, unmasking="sequential")),
    ("entropy_bounded 0.35, block 4", dict(block_length=4, unmasking="entropy_bounded", entropy_bound=0.35)),
    ("entropy_bounded 1.0, block 8", dict(block_length=8, unmasking="entropy_bounded", entropy_bound=1.0)),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="held-out toy problems (default 200)")
    parser.add_argument("--gen-length", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--model", default=None, help="an SDAR checkpoint with the toy's tokenizer (default: the toy)")
    parser.add_argument("--out", default="results/bench_sdar.json", help="JSON output path (a PNG beside it)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import DecodeOptions, Engine, toy
    from blockbatch.families import sdar as fam
    from blockbatch.reference import sdar as ref
    from blockbatch.toy import task as toy_task
    from blockbatch.toy import tokenizer as toy_tok

    model = args.model or toy.checkpoint_path("sdar")
    engine = Engine.from_pretrained(model)
    reference = fam.reference_model(engine.checkpoint)
    config = engine.config
    tokenizer = toy_tok.build_tokenizer()
    problems = toy_task.make_problems(args.n, seed=1000, split="test")
    prompts = [engine.encode(p.prompt, chat=False) for p in problems]
    rows = {}
    for label, options in RULES:
        o = DecodeOptions(policy="block", gen_length=args.gen_length, **{"threshold": 0.85, **options})
        correct, nfe, run, kinds, wall, ref_wall = 0, [], [], {"prefill": 0, "denoise": 0, "store": 0}, [], []
        for problem, prompt in zip(problems, prompts):
            t0 = time.perf_counter()
            out = torch.ops.blockbatch.decode(engine.model.obj, prompt, o.native)
            wall.append((time.perf_counter() - t0) * 1e3)
            stats = dict(zip(torch.ops.blockbatch.decode_stat_names(), out[1].tolist()))
            t0 = time.perf_counter()
            canvas, st = ref.block_generate(
                reference,
                prompt,
                gen_length=o.gen_length,
                block_length=o.block_length,
                steps=o.steps,
                unmasking=o.unmasking,
                threshold=o.threshold,
                entropy_bound=o.entropy_bound,
                mask_id=config.mask_token_id,
                eos_id=config.eos_token_id,
            )
            ref_wall.append((time.perf_counter() - t0) * 1e3)
            assert canvas.tolist() == out[0].tolist() and st["nfe"] == stats["nfe"], (label, problem.prompt)
            text = toy_tok.decode_response(tokenizer, out[0][prompt.numel() :].tolist())
            correct += toy_task.check_answer(problem, text)
            nfe.append(stats["nfe"])
            run.append(stats["nfe_block"])
            for kind, key in (("prefill", "nfe_prefill"), ("denoise", "nfe_block"), ("store", "nfe_store")):
                kinds[kind] += stats[key]
        n = len(problems)
        rows[label] = {
            "options": {k: v for k, v in options.items()},
            "accuracy": correct / n,
            "mean_nfe": statistics.fmean(nfe),
            "mean_forwards_run": statistics.fmean(run),
            "mean_nfe_kinds": {k: v / n for k, v in kinds.items()},
            "median_wall_ms": statistics.median(wall),
            "reference_median_wall_ms": statistics.median(ref_wall),
            "reference_equal": n,
        }
        r = rows[label]
        print(
            f"{label:32s} acc {r['accuracy']:.3f}  NFE {r['mean_nfe']:6.2f} (run {r['mean_forwards_run']:6.2f})  "
            f"{r['median_wall_ms']:7.2f} ms/sample (reference {r['reference_median_wall_ms']:7.2f})"
        )
    result = {
        "benchmark": "sdar_toy",
        "environment": environment(),
        "model": "toy/checkpoint_sdar" if args.model is None else args.model,
        "n": len(problems),
        "gen_length": args.gen_length,
        "rules": rows,
    }
    write_json(args.out, result)

    def draw(ax):
        colors = {
            "dynamic": "tab:blue",
            "static": "tab:orange",
            "sequential": "tab:green",
            "entropy_bounded": "tab:red",
        }
        for label, r in rows.items():
            ax.scatter(r["mean_nfe"], r["accuracy"], color=colors[r["options"]["unmasking"]])
            ax.annotate(label, (r["mean_nfe"], r["accuracy"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("mean NFE (the authors' count)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"SDAR toy, {len(problems)} held-out problems, gen {args.gen_length}")

    write_png(args.out, draw, size=(7, 4.5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
