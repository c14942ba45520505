"""Dream-7B-shaped step and decode time (random weights), LLaDA-8B beside it, side by side in one run.

    python benchmarks/bench_gpu_dream.py --out DIR [--shape 7b|tiny] [--device cuda|cpu] [--repeats 10]
        [--gen-length 256] [--decodes 3]

Shapes: "7b" is Dream-v0-7B (hidden 3584, 28 layers, 28 query / 4 KV heads, head dim 128, MLP
18944, vocab 152064) and LLaDA-8B (4096, 32 layers, 32 heads, MLP 12288, vocab 126464), random
bf16 weights built on the device; "tiny" is a small pair for a CPU smoke run (float32).
Per model, median over --repeats (CUDA events on the GPU, wall time on the CPU):
- "bb_step_ms": one BlockBatch block step, windows 4+8+16+32+64 = 124 query tokens (Dream's
  default branches; LLaDA adds 128: 252 tokens) over KV rows of L = 512, dual cache;
- "dual_step_ms": one 32-token dual-cache step over one KV row of L = 512;
- "full_forward_ms": a full forward over L = 512 tokens (vanilla step, block start, refresh);
- decodes (Dream only, --decodes of each, a 64-token prompt, gen --gen-length): dual cache
  (block 32, threshold 0.9) and BlockBatch (Dream defaults) with CUDA graphs: median wall ms,
  NFE, ms per forward. Random weights give near-uniform logits: the threshold is rarely reached, so
  NFE is near its worst case; the times per forward are the figures to compare.
Writes DIR/bench_gpu_dream.json and DIR/bench_gpu_dream.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

SHAPES = {
    "7b": {
        "dream": dict(d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, mlp_hidden_size=18944, vocab_size=152064),
        "llada": dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288, vocab_size=126464),
    },
    "tiny": {
        "dream": dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden_size=256, vocab_size=512),
        "llada": dict(d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=256, vocab_size=512),
    },
}
L = 512
DECODES_FAMILY = "dream"  # the model --decodes times whole decodes on (the benchmark's subject)


def build(family: str, shape: dict, device: str, dtype: torch.dtype):
    from blockbatch.random_checkpoint import random_config
    from blockbatch.loading import expected_weight_shapes
    from blockbatch.native import NativeModel

    config = random_config(family, **shape, max_sequence_length=4096)
    shapes = expected_weight_shapes(config)  # the family's own tensor names (families.REGISTRY)
    g = torch.Generator(device=device).manual_seed(0)
    weights = {}
    for name, s in shapes.items():
        t = torch.empty(s, dtype=dtype, device=device)
        t.normal_(0, 1.0 if len(s) == 1 else s[1] ** -0.5, generator=g)
        if name.endswith(".bias"):
            t.mul_(0.1)
        weights[name] = t
    model = NativeModel(config, weights, dtype=dtype, device=device)
    del weights
    return config, model


def timed(fn, repeats: int, device: str) -> float:
    """Median milliseconds of fn() (CUDA events on the GPU)."""
    fn()
    runs = []
    for _ in range(repeats):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            runs.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(runs)


def step_times(config, model, windows, device: str, repeats: int) -> dict:
    kv = model.new_kv(len(windows), L)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, config.vocab_size - 2, (w,), generator=g).to(device) for w in windows]
    pos = [torch.arange(100, 100 + w, device=device) for w in windows]
    one_ids, one_pos = [ids[-1][:32] if windows[-1] >= 32 else ids[-1]], [pos[-1][:32]]
    full_ids = [torch.randint(0, config.vocab_size - 2, (L,), generator=g).to(device)]
    full_pos = [torch.arange(L, device=device)]
    model.forward(full_ids, full_pos, kv, "full", kv_rows=[0])  # fill a row
    return {
        "bb_step_ms": timed(
            lambda: model.forward(ids, pos, kv, "dual", kv_rows=list(range(len(windows)))), repeats, device
        ),
        "bb_step_query_tokens": sum(windows),
        "dual_step_ms": timed(lambda: model.forward(one_ids, one_pos, kv, "dual", kv_rows=[0]), repeats, device),
        "full_forward_ms": timed(lambda: model.forward(full_ids, full_pos, kv, "full", kv_rows=[0]), repeats, device),
    }


def decode_times(config, model, device: str, gen_length: int, decodes: int) -> dict:
    from blockbatch.decoding import run_decode
    from blockbatch.options import DecodeOptions

    prompt = torch.randint(0, config.vocab_size - 2, (64,), generator=torch.Generator().manual_seed(2)).to(device)
    out = {}
    for name, options in (
        ("dual", DecodeOptions(policy="dual", gen_length=gen_length, block_length=32)),
        ("blockbatch", DecodeOptions(policy="blockbatch", gen_length=gen_length)),
    ):
        walls, nfe = [], None
        for _ in range(decodes + 1):  # the first run warms up (and records the graphs)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = run_decode(model.obj, prompt, options)
            if device == "cuda":
                torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
            nfe = r.stats["nfe"]
        wall = statistics.median(walls[1:])
        out[name] = {
            "median_ms": wall,
            "nfe": nfe,
            "ms_per_forward": wall / nfe,
            "graph_replays": r.stats["graph_replays"],
        }
        print(f"  dream decode {name}: {wall:.1f} ms, NFE {nfe}, {wall / nfe:.2f} ms/forward", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for bench_gpu_dream.json / .png")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="7b", help="model shapes (default 7b)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--repeats", type=int, default=10, help="timed repeats per step (default 10)")
    ap.add_argument("--gen-length", type=int, default=256, help="Dream decode length (default 256)")
    ap.add_argument("--decodes", type=int, default=3, help="timed decodes per policy (default 3; 0: none)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available (use --device cpu --shape tiny)", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.gen_length < 64 or args.gen_length % 64 or args.decodes < 0:
        print("error: --repeats >= 1, --gen-length a positive multiple of 64, --decodes >= 0", file=sys.stderr)
        return 2
    import blockbatch.native  # noqa: F401

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_gpu_dream.json")
    report = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "dtype": str(dtype),
        "L": L,
        "models": {},
    }
    for family, windows in (("dream", [4, 8, 16, 32, 64]), ("llada", [4, 8, 16, 32, 64, 128])):
        print(f"== {family} ({args.shape})", flush=True)
        config, model = build(family, SHAPES[args.shape][family], args.device, dtype)
        row = step_times(config, model, windows, args.device, args.repeats)
        print("  " + json.dumps(row), flush=True)
        if family == DECODES_FAMILY and args.decodes:
            row["decode"] = decode_times(config, model, args.device, args.gen_length, args.decodes)
        report["models"][family] = row
        with open(path, "w") as f:  # after each model: nothing lost on a time-out
            json.dump(report, f, indent=1)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    d, ll = report["models"]["dream"], report["models"]["llada"]
    report["dream_over_llada"] = {k: d[k] / ll[k] for k in ("bb_step_ms", "dual_step_ms", "full_forward_ms")}
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print("dream / llada:", json.dumps(report["dream_over_llada"]))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = ["bb_step_ms", "dual_step_ms", "full_forward_ms"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, fam in enumerate(("dream", "llada")):
            ax.bar([k + 0.38 * i for k in range(len(keys))], [report["models"][fam][k] for k in keys], 0.38, label=fam)
        ax.set_xticks([k + 0.19 for k in range(len(keys))], ["BlockBatch step", "dual 32-token step", "full L=512"])
        ax.set_ylabel(f"ms ({report['dtype']}, {report['device']})")
        ax.set_title(f"Dream-7B vs LLaDA-8B shape ({args.shape})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "bench_gpu_dream.png"), dpi=120)
    except ImportError:
        print("note: matplotlib is not installed; no PNG", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
