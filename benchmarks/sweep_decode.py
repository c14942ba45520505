"""Decode sweeps: wall time and NFE vs gen_length (64..1024), and peak memory vs branch count.

    python benchmarks/sweep_decode.py [--checkpoint DIR] [--threads 1] [--out results/sweep_decode.json]

gen_length sweep: dual cache (block 32, threshold 0.9) and BlockBatch (branches 4..128 that
divide gen_length) on the same prompts; medians over prompts. Memory sweep: one subprocess per
branch count (1..6 of 4,8,16,32,64,128) decoding gen_length 256; the peak RSS the decode adds
after the model is loaded.
Default model: a random LLaDA (d 256, 4 layers, vocab 512, logit scale 6) unless --checkpoint.
Writes JSON and one PNG per sweep (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from common import environment, write_json
from blockbatch.options import DEFAULT_BLOCK_SIZES

GEN_LENGTHS = (64, 128, 256, 512, 1024)
BRANCHES = DEFAULT_BLOCK_SIZES  # the table default (blockbatch.contract)


def make_model(checkpoint: str | None, workdir: str) -> str:
    if checkpoint:
        return checkpoint
    from blockbatch.random_checkpoint import make_random_checkpoint

    path = os.path.join(workdir, "random")
    make_random_checkpoint(
        path,
        seed=0,
        logit_scale=6.0,
        d_model=256,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        mlp_hidden_size=512,
        vocab_size=512,
        max_sequence_length=2048,
    )
    return path


def gen_length_sweep(path: str, prompts: int) -> list[dict]:
    from blockbatch.native import NativeModel
    from blockbatch.decoding import run_decode
    from blockbatch.options import DecodeOptions

    model = NativeModel.from_pretrained(path)
    vocab = model.config.vocab_size
    rows = []
    for G in GEN_LENGTHS:
        sizes = tuple(b for b in BRANCHES if G % b == 0)
        for name, options in (
            ("dual", DecodeOptions(policy="dual", gen_length=G, block_length=32)),
            ("blockbatch", DecodeOptions(policy="blockbatch", gen_length=G, block_sizes=sizes)),
        ):
            nfe, ms = [], []
            for p in range(prompts):
                ids = torch.randint(0, vocab - 2, (12,), generator=torch.Generator().manual_seed(p))
                t0 = time.perf_counter()
                out = run_decode(model.obj, ids, options)
                ms.append((time.perf_counter() - t0) * 1e3)
                nfe.append(out.stats["nfe"])
            row = {
                "policy": name,
                "gen_length": G,
                "median_nfe": statistics.median(nfe),
                "median_ms": statistics.median(ms),
            }
            rows.append(row)
            print(f"G={G:5d} {name:10s} NFE {row['median_nfe']:7.1f}  {row['median_ms']:9.1f} ms", flush=True)
    return rows


# Linux: writing 5 to /proc/self/clear_refs resets the peak RSS (VmHWM), so the child measures
# what the decode itself adds after the model is loaded.
_MEMORY_CHILD = """
import sys, torch
from blockbatch.native import NativeModel
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
model = NativeModel.from_pretrained(sys.argv[1])
sizes = tuple(int(x) for x in sys.argv[2].split(","))
open("/proc/self/clear_refs", "w").write("5")
base = hwm_mb()
run_decode(model.obj, torch.arange(1, 13), DecodeOptions(policy="blockbatch", gen_length=256, block_sizes=sizes))
print(base, hwm_mb())
"""


def memory_sweep(path: str) -> list[dict]:
    rows = []
    for n in range(1, len(BRANCHES) + 1):
        sizes = ",".join(str(b) for b in BRANCHES[:n])
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_CHILD, path, sizes],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        before, peak = (float(x) for x in out.stdout.split())
        rows.append({"branches": n, "block_sizes": sizes, "peak_rss_mb": peak, "decode_added_mb": peak - before})
        print(f"{n} branches ({sizes}): peak RSS {peak:.1f} MB (+{peak - before:.1f} MB for the decode)", flush=True)
    return rows


def plot(result: dict, out: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib not installed; no PNG", file=sys.stderr)
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for name in ("dual", "blockbatch"):
        rows = [r for r in result["gen_length"] if r["policy"] == name]
        a1.plot([r["gen_length"] for r in rows], [r["median_ms"] for r in rows], "o-", label=name)
        a2.plot([r["gen_length"] for r in rows], [r["median_nfe"] for r in rows], "o-", label=name)
    for ax, label in ((a1, "wall ms per sample (median)"), (a2, "NFE (median)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("gen_length")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + "_gen_length.png", dpi=120)
    fig, ax = plt.subplots(figsize=(4.5, 3.6))
    ax.plot([r["branches"] for r in result["memory"]], [r["decode_added_mb"] for r in result["memory"]], "o-")
    ax.set_xlabel("branches (4, 8, 16, ... in order)")
    ax.set_ylabel("memory added by the decode (MB)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.splitext(out)[0] + "_memory.png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/sweep_decode.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(args.checkpoint, tmp)
        result = {"gen_length": gen_length_sweep(path, args.prompts), "memory": memory_sweep(path)}
    write_json(
        args.out,
        {
            "benchmark": "decode_sweeps",
            "environment": environment(),
            "checkpoint": args.checkpoint or "random d256x4",
            **result,
        },
    )
    plot(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
