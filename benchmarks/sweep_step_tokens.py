"""Time of one packed block step vs packed query tokens (the paper's "flat until saturation").

    python benchmarks/sweep_step_tokens.py [--threads 2] [--out results/sweep_step_tokens.json]

Random ~50M-parameter LLaDA; dual-cache step over KV rows of L = 512; the query tokens are
split into windows of at most 128 tokens each with its own KV row (like BlockBatch branches).
Median of interleaved repeats per size; JSON and one PNG (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from bench_forward import CONFIG_50M
from common import environment, interleaved_medians, write_json

SIZES = (4, 8, 16, 32, 64, 128, 252, 512, 1024)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--canvas", type=int, default=512)
    ap.add_argument("--out", default="results/sweep_step_tokens.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch.native import NativeModel, pack_rows
    from blockbatch.random_checkpoint import random_config, random_weights

    config = random_config(**CONFIG_50M)
    model = NativeModel(config, random_weights(config))
    L = args.canvas
    steps = {}
    for tokens in SIZES:
        lengths = [128] * (tokens // 128) + ([tokens % 128] if tokens % 128 else [])
        kv = model.new_kv(len(lengths), L)
        ids = [torch.full((n,), config.mask_token_id) for n in lengths]
        pos = [torch.arange(L - n, L) for n in lengths]
        packed = pack_rows(ids, pos)
        steps[tokens] = lambda p=packed, k=kv: model.forward_packed(*p, k, "dual")
    timings = interleaved_medians({str(t): fn for t, fn in steps.items()}, args.repeats)
    rows = [{"query_tokens": t, "median_ms": timings[str(t)]["median_s"] * 1e3} for t in SIZES]
    for r in rows:
        print(
            f"{r['query_tokens']:5d} query tokens: {r['median_ms']:8.2f} ms  "
            f"({r['median_ms'] / r['query_tokens']:.3f} ms/token)"
        )
    write_json(
        args.out,
        {
            "benchmark": "step_time_vs_query_tokens",
            "environment": environment(),
            "canvas": L,
            "config": CONFIG_50M,
            "rows": rows,
        },
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.6))
        ax.plot([r["query_tokens"] for r in rows], [r["median_ms"] for r in rows], "o-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("packed query tokens per step")
        ax.set_ylabel("step time (ms, median)")
        ax.set_title(f"50M LLaDA, L={L}, {torch.get_num_threads()} CPU threads")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        png = os.path.splitext(args.out)[0] + ".png"
        fig.savefig(png, dpi=120)
        print(f"wrote {png}")
    except ImportError:
        print("note: matplotlib not installed; no PNG", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
