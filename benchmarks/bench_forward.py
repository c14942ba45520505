"""Native vs reference forward on a random ~50M-parameter LLaDA model.

One BlockBatch-shaped step: 6 packed rows of query lengths 4..128 (252 tokens), each row in
dual-cache mode over its own KV row of L = 512 slots. Both implementations run the same
computation (the reference row by row, as the authors' Python loop does); medians of
interleaved runs, the ratio, and the logits agreement are printed and written as JSON.

    python benchmarks/bench_forward.py [--repeats 7] [--threads 2] [--out results/bench_forward.json]
"""

from __future__ import annotations

import argparse
import sys

import torch

from common import environment, interleaved_medians, write_json

CONFIG_50M = dict(
    d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, mlp_hidden_size=1536, vocab_size=24576, max_sequence_length=2048
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per implementation (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--lengths", default="4,8,16,32,64,128", help="query length of each packed row")
    parser.add_argument("--canvas", type=int, default=512, help="KV row length L (default 512)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out", default="results/bench_forward.json", help="JSON output path")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch.native import NativeModel
    from blockbatch.reference.model import ReferenceModel
    from blockbatch.random_checkpoint import random_config, random_weights

    dtype = getattr(torch, args.dtype)
    config = random_config(**CONFIG_50M)
    weights = random_weights(config, seed=0, dtype=dtype)
    params = sum(t.numel() for t in weights.values())
    native = NativeModel(config, weights)
    reference = ReferenceModel(config, weights)
    lengths = [int(x) for x in args.lengths.split(",")]
    L = args.canvas
    g = torch.Generator().manual_seed(0)
    rows = len(lengths)
    canvases = [torch.randint(0, config.vocab_size, (L,), generator=g) for _ in range(rows)]
    kv_native, kv_ref = native.new_kv(rows, L), reference.new_kv(rows, L)
    full_pos = [torch.arange(L)] * rows
    native.forward(canvases, full_pos, kv_native, "full")
    reference.forward(canvases, full_pos, kv_ref, "full")
    ids, pos = [], []
    for r, n in enumerate(lengths):
        s = (L // 2 // n) * n  # a window in the middle of the canvas
        ids.append(torch.full((n,), config.mask_token_id))
        pos.append(torch.arange(s, s + n))
    # Same inputs to both; the KV rows are rewritten with identical values every call.
    from blockbatch.native import pack_rows

    packed = pack_rows(ids, pos)

    def run_native():
        return native.forward_packed(*packed, kv_native, "dual")

    def run_reference():
        return reference.forward(ids, pos, kv_ref, "dual")

    max_err = (torch.cat(run_reference()) - run_native().float()).abs().max().item()
    timings = interleaved_medians({"native": run_native, "reference": run_reference}, args.repeats)
    ratio = timings["reference"]["median_s"] / timings["native"]["median_s"]
    print(
        f"model: {params / 1e6:.1f}M params ({args.dtype}); {rows} rows, {sum(lengths)} query tokens, L={L}, "
        f"threads={torch.get_num_threads()}"
    )
    for name, t in timings.items():
        print(f"  {name:9s} median {t['median_s'] * 1e3:8.2f} ms   min {t['min_s'] * 1e3:8.2f} ms")
    print(f"  native speedup over reference: {ratio:.2f}x   max |logit diff| = {max_err:.2e}")
    write_json(
        args.out,
        {
            "benchmark": "forward_packed_dual",
            "environment": environment(),
            "params": params,
            "config": CONFIG_50M,
            "dtype": args.dtype,
            "lengths": lengths,
            "canvas": L,
            "timings": timings,
            "speedup_native_over_reference": ratio,
            "max_abs_logit_diff": max_err,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
