"""Many requests at once: throughput and latency vs max_batch, against one-by-one decoding.

    python benchmarks/bench_batch.py [--model toy|50m|llada-8b|DIR] [--n 32] [--batches 1,2,4,8,16,32]
        [--policies dual,blockbatch] [--gen-length 64] [--repeats 3] [--threads N] [--device cpu|cuda]
        [--dtype float32|bfloat16] [--cuda-batching 1|graphs] [--out results/bench_batch_toy.json]

The same --n requests (held-out toy problems; on a random model, prompts of 8..40 random tokens)
are decoded one by one (Engine.generate per prompt) and through torch.ops.blockbatch.decode_batch
(the scheduler, max_batch 1 included) at each max_batch, for each policy, in one run: --repeats
rounds of every policy one by one then at each max_batch (round robin), the times their medians.
Per setting: requests/s, generated tokens/s, mean and p99 request latency (its decode's own wall
time, from the moment it starts; the queue before it is not counted), packed forwards vs the
requests' forwards, and the speedup against one-by-one. Every batched request's tokens are
checked against its one-by-one result (float32 CPU: they must be equal; on a GPU the JSON reports
how many are, and the share of equal tokens).
Per policy the JSON also gives the compute floor: the query tokens all the requests' forwards
carry, at the seconds per token of one large packed forward (2048 tokens in rows of 128, one
logit row each: the cheapest a token gets on this model and machine), and the speedup over one
by one that this floor allows: an estimate of the most any packing can give here.
Writes the JSON and a PNG (throughput vs max_batch) next to it.

On a GPU (--device cuda): the batched runs go through the scheduler on CUDA, which this script
turns on (BLOCKBATCH_CUDA_BATCHING=--cuda-batching: 1, eager packed steps, or graphs, padded packed
steps replayed from CUDA graphs; the JSON gives the padded forwards, graph captures and replays
and the replay hit rate); one by one runs with CUDA graphs, as Engine.generate does. With
BLOCKBATCH_BATCH_INVARIANT=1 in the environment both run the batch-invariant forward.
--model llada-8b is LLaDA-8B's shape (4096 wide, 32 layers, vocab 126464) with random weights
built on the device (--dtype bfloat16 for the issue's target): near-uniform
logits, so a dual-cache step commits about one token and the NFE is near its worst case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from common import environment, interleaved_medians


def _model(name: str, device: str = "cpu", dtype: torch.dtype | None = None):
    from blockbatch.engine import Engine

    if name == "toy":
        return Engine.from_pretrained(None, device, dtype), "toy"
    if name == "50m":
        from blockbatch.random_checkpoint import make_random_checkpoint

        folder = tempfile.mkdtemp(prefix="bb-50m-")
        make_random_checkpoint(
            folder, seed=0, logit_scale=4.0, d_model=512, n_layers=8, n_heads=8, mlp_hidden_size=1536, vocab_size=32000
        )
        return Engine.from_pretrained(folder, device, dtype), "random-50m"
    if name in ("llada-8b", "llada-tiny"):  # built on the device: 16 GB of bf16 weights never touch the disk
        from bench_gpu_dream import SHAPES, build
        from blockbatch.loading import Checkpoint

        dtype = dtype or (torch.bfloat16 if name == "llada-8b" else torch.float32)
        config, model = build("llada", SHAPES["7b" if name == "llada-8b" else "tiny"]["llada"], device, dtype)
        return Engine(Checkpoint(f"random-{name}", config, {}), device, dtype, model=model), f"random-{name}"
    return Engine.from_pretrained(name, device, dtype), os.path.basename(os.path.normpath(name))


def _prompts(engine, n: int) -> list[list[int]]:
    if engine.codec is not None and engine.config.vocab_size < 1000:
        from blockbatch.toy import task

        return [engine.codec.encode(p.prompt, chat=False) for p in task.make_problems(n, 0, "test")]
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(0, engine.config.vocab_size - 2, (8 + (i * 7) % 33,), generator=g)
        out.append([t if t != engine.config.mask_token_id else 0 for t in ids.tolist()])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="toy",
        help="toy (the shipped LLaDA toy), 50m (a random ~50M LLaDA), llada-8b "
        "(LLaDA-8B's shape, random weights built on the device; llada-tiny: its small smoke-run "
        "twin) or a folder",
    )
    ap.add_argument("--n", type=int, default=32, help="requests (default 32)")
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="max_batch values (default 1,2,4,8,16,32)")
    ap.add_argument(
        "--policies",
        default="dual,blockbatch,blockbatch-auto",
        help="comma-separated (default dual,blockbatch,blockbatch-auto: blockbatch with "
        "branch_budget=auto, whose batched results differ from one by one by design)",
    )
    ap.add_argument("--gen-length", type=int, default=64, help="generation length (default 64)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of every policy one by one then at each max_batch, round robin; the times are medians (default 3)",
    )
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's choice)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weights and activations (default: the checkpoint's; llada-8b: bfloat16)",
    )
    ap.add_argument(
        "--cuda-batching",
        choices=("1", "graphs"),
        default="graphs",
        help="--device cuda: BLOCKBATCH_CUDA_BATCHING for the batched runs (default graphs, the "
        "library's default; 1: eager steps)",
    )
    ap.add_argument("--out", default="results/bench_batch_toy.json")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device", file=sys.stderr)
            return 2
        os.environ["BLOCKBATCH_CUDA_BATCHING"] = args.cuda_batching  # the scheduler on CUDA: what this measures
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
        assert batches and all(b >= 1 for b in batches) and args.n >= 1 and args.repeats >= 1
    except (ValueError, AssertionError):
        print(
            "error: --batches must be positive integers separated by commas, --n >= 1 and --repeats >= 1",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from blockbatch import DecodeOptions, settings
    from blockbatch.decoding import run_decode_batch

    engine, label = _model(args.model, args.device, getattr(torch, args.dtype) if args.dtype else None)
    prompts = _prompts(engine, args.n)
    report = {
        "environment": environment(),
        "command": " ".join(["python", *sys.argv]),
        "model": label,
        "n": args.n,
        "gen_length": args.gen_length,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "dtype": str(engine.model.dtype).removeprefix("torch."),
        "cuda_batching": args.cuda_batching if args.device == "cuda" else None,
        "batch_invariant": args.device == "cuda" and settings.value("BLOCKBATCH_BATCH_INVARIANT") == "1",
        "step_curve": engine.step_curve,
        "policies": {},
    }
    budget = 1 << 30
    per_token_s = _seconds_per_token(engine)
    encoded = [torch.tensor(p, dtype=torch.long) for p in prompts]
    policies = [p for p in args.policies.split(",") if p]
    options = {
        policy: DecodeOptions(
            policy=policy.removesuffix("-auto"),
            gen_length=args.gen_length,
            block_length=32,
            branch_budget="auto" if policy.endswith("-auto") else "full",
        )
        for policy in policies
    }
    one_runs = {policy: [] for policy in policies}  # seconds of each round's one-by-one pass
    runs = {policy: {b: [] for b in batches} for policy in policies}  # (seconds, outputs, counters) per round
    alones = {}
    # Round robin (each round: every policy one by one, then at each max_batch), so a drift of this
    # shared machine hits every setting alike; the times below are medians over the rounds.
    for round_ in range(args.repeats):
        for policy, o in options.items():
            curve = engine.step_curve if policy.endswith("-auto") else None
            t0 = time.perf_counter()
            alones[policy] = [engine.generate([p], o)[0] for p in prompts]
            one_runs[policy].append(time.perf_counter() - t0)
            for b in batches:
                t0 = time.perf_counter()
                outs, st = run_decode_batch(engine.model.obj, encoded, [o] * len(encoded), b, 0, curve)
                runs[policy][b].append((time.perf_counter() - t0, outs, st))
            print(
                f"round {round_ + 1}/{args.repeats} {policy}: one by one {one_runs[policy][-1]:.2f} s, "
                + ", ".join(f"max_batch {b} {runs[policy][b][-1][0]:.2f} s" for b in batches),
                file=sys.stderr,
                flush=True,
            )
    for policy, o in options.items():
        alone, batch_runs = alones[policy], runs[policy]
        one_s = statistics.median(one_runs[policy])
        tokens = sum(len(g.ids) for g in alone)
        query_tokens = sum(sum(g.stats["query_tokens_per_step"]) for g in alone)
        floor_s = query_tokens * per_token_s
        rows = {
            "one_by_one": {
                "seconds": one_s,
                "runs_s": one_runs[policy],
                "requests_per_s": args.n / one_s,
                "tokens_per_s": tokens / one_s,
                "mean_latency_ms": statistics.mean(g.stats["wall_ms"] for g in alone),
                "p99_latency_ms": _p99([g.stats["wall_ms"] for g in alone]),
                "forwards": sum(g.stats["nfe"] for g in alone),
            },
            "compute_floor": {
                "query_tokens": query_tokens,
                "seconds_per_token": per_token_s,
                "seconds": floor_s,
                "speedup_bound": one_s / floor_s,
            },
            "kv_1GiB": engine.kv_report(o, max(len(p) for p in prompts), budget),
        }
        for b in batches:
            s = statistics.median(t for t, _, _ in batch_runs[b])
            # every round's results are checked; the counters and latencies are the median round's
            equal = min(
                sum(
                    out.tokens[len(p) :].tolist() == a.raw_ids and out.stats["nfe"] == a.stats["nfe"]
                    for out, p, a in zip(outs, prompts, alone)
                )
                for _, outs, _ in batch_runs[b]
            )
            _, outs, st = sorted(batch_runs[b], key=lambda r: r[0])[len(batch_runs[b]) // 2]
            got = [(out.tokens[len(p) :].tolist(), out.stats) for out, p in zip(outs, prompts)]
            same_tokens = sum(x == y for (raw, _), a in zip(got, alone) for x, y in zip(raw, a.raw_ids))
            rows[f"batch_{b}"] = {
                "seconds": s,
                "runs_s": [t for t, _, _ in batch_runs[b]],
                "requests_per_s": args.n / s,
                "tokens_per_s": tokens / s,
                "speedup_vs_one_by_one": one_s / s,
                "of_compute_floor": floor_s / s,
                "mean_latency_ms": statistics.mean(stats["wall_ms"] for _, stats in got),
                "p99_latency_ms": _p99([stats["wall_ms"] for _, stats in got]),
                "packed_forwards": st.get("packed_forwards"),
                "padded_forwards": st.get("padded_forwards"),
                "graph_captures": st.get("graph_captures"),
                "graph_replays": st.get("graph_replays"),
                "replay_hit_rate": st["graph_replays"] / st["padded_forwards"] if st.get("padded_forwards") else None,
                "request_forwards": st.get("request_forwards"),
                "equal_to_one_by_one": f"{equal}/{args.n}",
                "token_agreement": same_tokens / sum(len(a.raw_ids) for a in alone),
                "mean_nfe": statistics.mean(stats["nfe"] for _, stats in got),
                "mean_query_tokens_per_step": statistics.mean(
                    statistics.mean(stats["query_tokens_per_step"]) for _, stats in got
                ),
            }
            print(
                f"{label} {policy} max_batch {b}: {args.n / s:.1f} req/s, {one_s / s:.2f}x one-by-one "
                f"(compute floor: {one_s / floor_s:.2f}x), p99 {rows[f'batch_{b}']['p99_latency_ms']:.0f} ms, "
                f"equal {equal}/{args.n}",
                flush=True,
            )
        report["policies"][policy] = rows
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 4))
        for policy, rows in report["policies"].items():
            if not isinstance(rows, dict) or "one_by_one" not in rows:
                continue
            ax.plot(
                batches, [rows[f"batch_{b}"]["tokens_per_s"] for b in batches], marker="o", label=f"{policy} batched"
            )
            ax.axhline(
                rows["one_by_one"]["tokens_per_s"],
                ls="--",
                lw=1,
                label=f"{policy} one by one",
                color=ax.lines[-1].get_color(),
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_batch")
        ax.set_ylabel("generated tokens / s")
        ax.set_title(f"{label}, {args.n} requests, gen {args.gen_length}, {report['threads']} threads")
        ax.legend(fontsize=8)
        fig.tight_layout()
        png = os.path.splitext(args.out)[0] + ".png"
        fig.savefig(png, dpi=120)
        print(f"wrote {png}")
    except ImportError:
        print("note: matplotlib is not installed; no PNG", file=sys.stderr)
    return 0


def _seconds_per_token(engine, tokens: int = 2048, repeats: int = 3) -> float:
    """Least seconds per query token of one large packed forward on this model: ``tokens`` tokens in
    rows of at most 128, full attention within each row, the logits of one token per row."""
    from blockbatch.native import pack_rows

    c = engine.config
    row = min(128, c.max_sequence_length)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, c.vocab_size, (row,), generator=g) for _ in range(max(1, tokens // row))]
    ids = [torch.where(t == c.mask_token_id, 0, t) for t in ids]
    packed = pack_rows(ids, [torch.arange(row)] * len(ids), engine.device)
    logit_index = packed[2][1:] - 1  # each row's last token
    # the read (.item()) waits for the device
    timing = interleaved_medians(
        {"forward": lambda: engine.model.forward_packed(*packed, logit_index=logit_index).sum().item()}, repeats
    )["forward"]
    return timing["min_s"] / (row * len(ids))


def _p99(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.99 * (len(v) - 1))))]


if __name__ == "__main__":
    sys.exit(main())
