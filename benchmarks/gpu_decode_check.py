"""Decode on the GPU vs the CPU on the toy task: token equality, bf16 agreement, graph replay.

    python benchmarks/gpu_decode_check.py --out DIR [--n 50]

For each policy (vanilla gen 64, dual and BlockBatch gen 128), on the held-out toy problems:
float32 GPU tokens == CPU tokens; CUDA-graph replay == eager (float32 and bf16); bf16 vs float32
token agreement (generated positions) and accuracy; median ms per sample eager vs graphs; graph
captures / replays per sample. Writes DIR/gpu_decode_check.json.

With --candidates (a run of its own: a faulting opt-in kernel poisons its CUDA context): bf16
with graphs, default kernels vs each opt-in kernel and all of them together (CANDIDATES in
common.py, from the settings table): token agreement with the default bf16 run and with float32,
and accuracy. Writes DIR/gpu_decode_candidates.json; with no kernel candidates left it says so
and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from common import environ

from blockbatch import settings

CANDIDATES = settings.candidates("llada")  # the LLaDA-8B-shaped model runs only these


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=50, help="held-out toy problems (default 50)")
    ap.add_argument("--candidates", action="store_true", help="compare the opt-in kernels instead (see above)")
    args = ap.parse_args(argv)
    if args.candidates and not CANDIDATES:
        print("no kernel candidates left in the settings table (python/blockbatch/settings.py): nothing to compare")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    from blockbatch.engine import Engine
    from blockbatch.toy import task

    problems = task.make_problems(args.n, 0, "test")
    engines = {
        "cpu": Engine.from_pretrained(None, "cpu"),
        "fp32": Engine.from_pretrained(None, "cuda"),
        "bf16": Engine.from_pretrained(None, "cuda", torch.bfloat16),
    }
    check = check_candidates if args.candidates else check_policy
    out_name = "gpu_decode_candidates.json" if args.candidates else "gpu_decode_check.json"
    report = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "n": args.n,
        "policies": {},
        "errors": {},
    }
    os.makedirs(args.out, exist_ok=True)
    for name, gen in (("vanilla", 64), ("dual", 128), ("blockbatch", 128)):
        try:
            report["policies"][name] = check(engines, problems, name, gen, args.n)
        except Exception as e:  # noqa: BLE001 - recorded in the JSON and the exit status; the other policies still run
            report["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"error in {name}: {report['errors'][name]}", file=sys.stderr, flush=True)
        else:
            print(name, json.dumps(report["policies"][name]), flush=True)
        with open(os.path.join(args.out, out_name), "w") as f:  # after each policy: nothing lost on a time-out
            json.dump(report, f, indent=2)
    return 1 if report["errors"] else 0


def check_policy(engines, problems, name: str, gen: int, n: int) -> dict:
    """One policy's runs (CPU, GPU fp32/bf16, eager/graphs) on the problems, compared (see the module docstring)."""
    from blockbatch.bench import policy_options

    base = policy_options(name, gen)
    runs = {}
    for label, engine, graphs in (
        ("cpu", "cpu", True),
        ("fp32_eager", "fp32", False),
        ("fp32_graph", "fp32", True),
        ("bf16_eager", "bf16", False),
        ("bf16_graph", "bf16", True),
    ):
        runs[label] = generate_all(engines[engine], problems, base.replace(cuda_graphs=graphs), engine != "cpu")
    same, agreement = comparisons(runs, n)
    return {
        "fp32_gpu_equals_cpu": same("fp32_graph", "cpu"),
        "fp32_graph_equals_eager": same("fp32_graph", "fp32_eager"),
        "bf16_graph_equals_eager": same("bf16_graph", "bf16_eager"),
        "bf16_vs_fp32_token_agreement": agreement("bf16_graph", "fp32_graph"),
        **outcomes(runs, n),
        "mean_nfe": {k: statistics.mean(r[0].stats["nfe"] for r in v) for k, v in runs.items()},
        "graph_captures_per_sample": statistics.mean(r[0].stats["graph_captures"] for r in runs["bf16_graph"]),
        "graph_replays_per_sample": statistics.mean(r[0].stats["graph_replays"] for r in runs["bf16_graph"]),
    }


def generate_all(engine, problems, opts, gpu: bool, env: dict | None = None) -> list:
    """(generation, ms, correct) per problem, with `env` set for the run."""
    from blockbatch.toy import task

    with environ(**(env or {})):
        out = []
        for p in problems:
            t0 = time.perf_counter()
            [g] = engine.generate(p.prompt, opts)
            if gpu:
                torch.cuda.synchronize()
            out.append((g, (time.perf_counter() - t0) * 1e3, task.check_answer(p, g.text)))
        return out


def comparisons(runs: dict, n: int):
    """same(a, b): the share of problems with identical generations; agreement(a, b): the mean share
    of equal generated tokens."""

    def same(a, b):
        return sum(x[0].raw_ids == y[0].raw_ids for x, y in zip(runs[a], runs[b])) / n

    def agreement(a, b):
        eq = [
            sum(i == j for i, j in zip(x[0].raw_ids, y[0].raw_ids)) / len(x[0].raw_ids)
            for x, y in zip(runs[a], runs[b])
        ]
        return statistics.mean(eq)

    return same, agreement


def outcomes(runs: dict, n: int) -> dict:
    """Per run: the share of problems answered correctly and the median ms per problem."""
    return {
        "accuracy": {k: sum(r[2] for r in v) / n for k, v in runs.items()},
        "median_ms": {k: statistics.median(r[1] for r in v) for k, v in runs.items()},
    }


def check_candidates(engines, problems, name: str, gen: int, n: int) -> dict:
    """Default kernels vs each opt-in one on the problems (see the module docstring)."""
    from blockbatch.bench import policy_options

    opts = policy_options(name, gen).replace(cuda_graphs=True)
    runs = {
        "fp32": generate_all(engines["fp32"], problems, opts, True),
        "bf16": generate_all(engines["bf16"], problems, opts, True),
    }
    for cand, env in CANDIDATES.items():
        runs[f"bf16_{cand}"] = generate_all(engines["bf16"], problems, opts, True, env)
    _, agreement = comparisons(runs, n)
    out = {}
    for cand in CANDIDATES:
        out[f"bf16_{cand}_vs_default_token_agreement"] = agreement(f"bf16_{cand}", "bf16")
        out[f"bf16_{cand}_vs_fp32_token_agreement"] = agreement(f"bf16_{cand}", "fp32")
    return {**out, **outcomes(runs, n)}


if __name__ == "__main__":
    sys.exit(main())
