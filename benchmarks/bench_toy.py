"""Accuracy, NFE and time per sample on the toy task's held-out problems, policies side by side.

    python benchmarks/bench_toy.py [--n 200] [--gen-length 128] [--threads 2] [--out results/bench_toy.json]

Policies (interleaved per problem, so machine drift hits all alike):
  vanilla     one token per step (LLaDA fixed schedule, steps = gen_length, block 32)
  dual        Fast-dLLM dual cache, block 32, threshold 0.9 (the paper's baseline)
  blockbatch  branches 4,8,16,32,64,128, threshold 0.9, merge gate 0.5, sync gap 8, refresh 32
Each row: accuracy (exact match of the final answer), mean / median NFE, the paper's NFE
(winner participation), mean and median wall ms per sample; ratios against dual cache.
Also times one packed 6-branch block step, native vs the reference model (same inputs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from common import environment, interleaved_medians, write_json


def policies(gen_length: int):
    from blockbatch.options import DecodeOptions

    return {
        "vanilla": DecodeOptions(policy="vanilla", gen_length=gen_length, block_length=32, threshold=None,
                                 steps=gen_length),
        "dual": DecodeOptions(policy="dual", gen_length=gen_length, block_length=32, threshold=0.9),
        "blockbatch": DecodeOptions(policy="blockbatch", gen_length=gen_length, threshold=0.9, stop_on_eos=True),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out problems (default 200)")
    ap.add_argument("--gen-length", type=int, default=128, help="generation length (default 128)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--checkpoint", default=None, help="default: the shipped toy model")
    ap.add_argument("--out", default="results/bench_toy.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch.engine import Engine
    from blockbatch.toy import task

    engine = Engine.from_pretrained(args.checkpoint)
    problems = task.make_problems(args.n, 0, "test")
    opts = policies(args.gen_length)
    records = []
    t0 = time.perf_counter()
    for i, problem in enumerate(problems):
        for name, options in opts.items():
            start = time.perf_counter()
            [gen] = engine.generate(problem.prompt, options, chat=False)
            wall_ms = (time.perf_counter() - start) * 1e3
            records.append({"problem": i, "policy": name, "prompt": problem.prompt, "output": gen.text,
                            "correct": task.check_answer(problem, gen.text), "nfe": gen.stats["nfe"],
                            "nfe_paper": gen.stats["nfe_paper"], "wall_ms": wall_ms,
                            "winner_block_size": gen.stats["winner_block_size"],
                            "early_exit": gen.stats["early_exit"]})
        if (i + 1) % 20 == 0 or i + 1 == len(problems):
            print(f"\r{i + 1}/{len(problems)} problems, {time.perf_counter() - t0:.0f}s", end="", file=sys.stderr)
    print(file=sys.stderr)

    summary = {}
    for name in opts:
        rows = [r for r in records if r["policy"] == name]
        summary[name] = {
            "accuracy": sum(r["correct"] for r in rows) / len(rows),
            "mean_nfe": statistics.mean(r["nfe"] for r in rows),
            "median_nfe": statistics.median(r["nfe"] for r in rows),
            "mean_nfe_paper": statistics.mean(r["nfe_paper"] for r in rows),
            "mean_wall_ms": statistics.mean(r["wall_ms"] for r in rows),
            "median_wall_ms": statistics.median(r["wall_ms"] for r in rows),
        }
    base = summary["dual"]
    for s in summary.values():
        s["nfe_vs_dual"] = s["mean_nfe"] / base["mean_nfe"]
        s["speedup_vs_dual"] = base["median_wall_ms"] / s["median_wall_ms"]

    # One packed BlockBatch step (windows of 4..128 over the toy canvas): native vs reference.
    step = packed_step_timing(engine, problems[0].prompt, args.gen_length)

    print(f"toy task, {len(problems)} held-out problems, gen_length {args.gen_length}, "
          f"threads {torch.get_num_threads()}")
    print(f"{'policy':11s} {'acc':>6s} {'NFE':>7s} {'NFE med':>7s} {'paper':>6s} {'ms mean':>8s} {'ms med':>7s} "
          f"{'NFE/dual':>8s} {'speedup':>7s}")
    for name, s in summary.items():
        print(f"{name:11s} {s['accuracy']:6.3f} {s['mean_nfe']:7.2f} {s['median_nfe']:7.1f} {s['mean_nfe_paper']:6.1f} "
              f"{s['mean_wall_ms']:8.2f} {s['median_wall_ms']:7.2f} {s['nfe_vs_dual']:8.3f} {s['speedup_vs_dual']:7.2f}")
    print(f"packed 6-branch block step ({step['query_tokens']} query tokens): native {step['native_ms']:.3f} ms, "
          f"reference {step['reference_ms']:.3f} ms ({step['reference_ms'] / step['native_ms']:.1f}x)")
    write_json(args.out, {"benchmark": "toy_policies", "environment": environment(), "n": len(problems),
                          "gen_length": args.gen_length, "summary": summary, "packed_step": step,
                          "records": records})
    return 0


def packed_step_timing(engine, prompt: str, gen_length: int) -> dict:
    from blockbatch.native import pack_rows
    from blockbatch.reference.model import ReferenceModel

    cfg = engine.config
    ids = torch.tensor(engine.codec.encode(prompt, chat=False))
    lp, L = ids.numel(), ids.numel() + gen_length
    sizes = [4, 8, 16, 32, 64, 128]
    canvas = torch.full((L,), cfg.mask_token_id)
    canvas[:lp] = ids
    ref = ReferenceModel.from_checkpoint(engine.checkpoint)
    kv_n, kv_r = engine.model.new_kv(len(sizes), L), ref.new_kv(len(sizes), L)
    for r in range(len(sizes)):
        engine.model.forward([canvas], [torch.arange(L)], kv_n, "full", kv_rows=[r])
        ref.forward([canvas], [torch.arange(L)], kv_r, "full", kv_rows=[r])
    q_ids = [canvas[lp:lp + b] for b in sizes]
    q_pos = [torch.arange(lp, lp + b) for b in sizes]
    packed = pack_rows(q_ids, q_pos)
    t = interleaved_medians({
        "native": lambda: engine.model.forward_packed(*packed, kv_n, "dual"),
        "reference": lambda: ref.forward(q_ids, q_pos, kv_r, "dual"),
    }, repeats=21, warmup=2)
    return {"query_tokens": sum(sizes), "native_ms": t["native"]["median_s"] * 1e3,
            "reference_ms": t["reference"]["median_s"] * 1e3}


if __name__ == "__main__":
    sys.exit(main())
