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
import sys

import torch

from common import environment, interleaved_medians, write_json
from blockbatch.options import DEFAULT_BLOCK_SIZES


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="held-out problems (default 200)")
    ap.add_argument("--gen-length", type=int, default=128, help="generation length (default 128)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--checkpoint", default=None, help="default: the shipped toy model")
    ap.add_argument("--compare-reference", action="store_true", help="also time the reference loops")
    ap.add_argument("--out", default="results/bench_toy.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import bench
    from blockbatch.engine import Engine

    engine = Engine.from_pretrained(args.checkpoint)
    policies = {name: bench.policy_options(name, args.gen_length) for name in bench.DEFAULT_POLICIES}
    result = bench.run_bench(engine, bench.load_tasks(None, args.n), policies, args.compare_reference)
    step = packed_step_timing(engine, bench.load_tasks(None, 1)[0].prompt, args.gen_length)
    print(f"toy task, {args.n} held-out problems, gen_length {args.gen_length}, threads {torch.get_num_threads()}")
    print(bench.format_table(result))
    print(
        f"packed 6-branch block step ({step['query_tokens']} query tokens): native {step['native_ms']:.3f} ms, "
        f"reference {step['reference_ms']:.3f} ms ({step['reference_ms'] / step['native_ms']:.1f}x)"
    )
    write_json(
        args.out,
        {
            "benchmark": "toy_policies",
            "environment": environment(),
            "n": args.n,
            "gen_length": args.gen_length,
            "packed_step": step,
            **result,
        },
    )
    return 0


def packed_step_timing(engine, prompt: str, gen_length: int) -> dict:
    from blockbatch.native import pack_rows
    from blockbatch.reference.model import ReferenceModel

    cfg = engine.config
    ids = torch.tensor(engine.codec.encode(prompt, chat=False))
    lp, L = ids.numel(), ids.numel() + gen_length
    sizes = list(DEFAULT_BLOCK_SIZES)
    canvas = torch.full((L,), cfg.mask_token_id)
    canvas[:lp] = ids
    ref = ReferenceModel.from_checkpoint(engine.checkpoint)
    kv_n, kv_r = engine.model.new_kv(len(sizes), L), ref.new_kv(len(sizes), L)
    for r in range(len(sizes)):
        engine.model.forward([canvas], [torch.arange(L)], kv_n, "full", kv_rows=[r])
        ref.forward([canvas], [torch.arange(L)], kv_r, "full", kv_rows=[r])
    q_ids = [canvas[lp : lp + b] for b in sizes]
    q_pos = [torch.arange(lp, lp + b) for b in sizes]
    packed = pack_rows(q_ids, q_pos)
    t = interleaved_medians(
        {
            "native": lambda: engine.model.forward_packed(*packed, kv_n, "dual"),
            "reference": lambda: ref.forward(q_ids, q_pos, kv_r, "dual"),
        },
        repeats=21,
        warmup=2,
    )
    return {
        "query_tokens": sum(sizes),
        "native_ms": t["native"]["median_s"] * 1e3,
        "reference_ms": t["reference"]["median_s"] * 1e3,
    }


if __name__ == "__main__":
    sys.exit(main())
