"""Soak benchmark: many decodes in ONE process, checking that resident memory does not grow.

A leak in the native decode loop (a tensor kept alive per request, a cache keyed by something
that never repeats, a recorded step shape never freed) shows up only over many requests. This
runs N decodes (default 1,000) of the shipped toy model in one process, cycling through a mix
of policies and commit rules (vanilla, prefix, dual with threshold / factor / fixed schedule,
sampling at temperature > 0, BlockBatch with periodic and divergence refreshes) on distinct
toy-task prompts, and samples the process RSS (/proc/self/statm) after every decode.

Verdict: the first --warmup decodes fill the allocator's pools and the op's caches; the RSS
after warm-up (median of the next --window samples) is the baseline, the median of the last
--window samples the end point. The run passes when end / baseline - 1 < --max-growth (1%) and
exits 1 otherwise. The least-squares slope over all post-warm-up samples is reported too
(bytes per decode: a steady leak of even 1 KB per decode shows there before it reaches 1%).

Writes a JSON record (--out, default docs/bench/soak.json: environment, settings, the mix, per
variant counts / mean NFE / median ms, every RSS sample, the verdict) and a PNG of RSS over
decodes next to it (same name, .png; needs matplotlib).

    python benchmarks/soak.py                      # 1,000 decodes, gen_length 64, ~1-2 min on 2 cores
    python benchmarks/soak.py --n 200 --out /tmp/soak.json   # a quick look
    python benchmarks/soak.py --gen-length 64 --threads 2

This is a benchmark, not a test: run it by hand after touching the decode loop, and commit its
output when the numbers change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from blockbatch.options import DEFAULT_BLOCK_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mix(gen_length: int) -> list[tuple[str, dict]]:
    """The decode variants the soak cycles through (name, DecodeOptions fields)."""
    block = min(16, gen_length)
    sizes = tuple(b for b in DEFAULT_BLOCK_SIZES if b <= gen_length and gen_length % b == 0)
    return [
        ("dual", dict(policy="dual", block_length=block)),
        ("blockbatch", dict(policy="blockbatch", block_sizes=sizes)),
        ("prefix", dict(policy="prefix", block_length=block)),
        ("dual-factor", dict(policy="dual", block_length=block, threshold=None, factor=1.0)),
        (
            "blockbatch-divergence",
            dict(policy="blockbatch", block_sizes=sizes, refresh_mode="divergence", refresh_tokens=8),
        ),
        ("dual-fixed", dict(policy="dual", block_length=block, threshold=None, steps=gen_length // 2)),
        ("prefix-sampled", dict(policy="prefix", block_length=block, temperature=0.7)),
        ("vanilla", dict(policy="vanilla", block_length=gen_length, threshold=None, steps=gen_length)),
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Progress:
    """tqdm when it is installed, else a one-line counter on stderr."""

    def __init__(self, total: int, quiet: bool):
        self.total, self.done, self.quiet, self.start = total, 0, quiet, time.perf_counter()
        self.bar = None
        if not quiet:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="decode", file=sys.stderr)
            except ImportError:
                pass

    def update(self, rss: int) -> None:
        self.done += 1
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(f"RSS {rss / 2**20:.1f} MiB", refresh=False)
            self.bar.update(1)
        elif self.done % 10 == 0 or self.done == self.total:
            elapsed = time.perf_counter() - self.start
            eta = elapsed / self.done * (self.total - self.done)
            sys.stderr.write(
                f"\rsoak {self.done}/{self.total} decodes  RSS {rss / 2**20:.1f} MiB  "
                f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s "
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif not self.quiet:
            sys.stderr.write("\n")


def slope(ys: list[int]) -> float:
    """Least-squares slope of ys over 0..len-1 (units of ys per step)."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def plot(path: str, rss: list[int], warmup: int, window: int, verdict: dict) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)", file=sys.stderr)
        return None
    mib = [r / 2**20 for r in rss]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(1, len(mib) + 1), mib, lw=1, color="tab:blue", label="RSS after each decode")
    ax.axvspan(0.5, warmup + 0.5, color="0.9", label=f"warm-up ({warmup} decodes)")
    ax.axhline(
        verdict["baseline_rss_bytes"] / 2**20,
        color="tab:green",
        ls="--",
        lw=1,
        label=f"baseline (median of decodes {warmup + 1}..{warmup + window})",
    )
    ax.axhline(
        verdict["baseline_rss_bytes"] / 2**20 * (1 + verdict["max_growth"]),
        color="tab:red",
        ls=":",
        lw=1,
        label=f"+{verdict['max_growth']:.0%} limit",
    )
    ax.set_xlabel("decodes in this process")
    ax.set_ylabel("resident set size (MiB)")
    ax.set_title(f"soak: {len(rss)} decodes, RSS growth after warm-up {verdict['growth']:+.3%}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " See the module docstring (python benchmarks/soak.py --help "
        "prints this; the file's top explains the verdict).",
        epilog="Exit status: 0 when RSS growth after warm-up stays under --max-growth, 1 when it does not, "
        "2 on a usage error. Example: python benchmarks/soak.py --n 200 --out /tmp/soak.json",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--n", type=int, default=1000, help="decodes in the one process (all variants, cycled)")
    ap.add_argument(
        "--warmup", type=int, default=100, help="decodes before the baseline RSS is taken (allocator pools, op caches)"
    )
    ap.add_argument(
        "--window",
        type=int,
        default=50,
        help="samples in the medians that give the baseline (after warm-up) and the end RSS",
    )
    ap.add_argument("--gen-length", type=int, default=64, help="tokens generated per decode (short: a fast soak)")
    ap.add_argument("--max-growth", type=float, default=0.01, help="allowed RSS growth after warm-up (0.01 = 1%%)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0, help="seed of the toy-task prompts")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: the toy model shipped in the package)")
    ap.add_argument(
        "--out",
        default=os.path.join(ROOT, "docs", "bench", "soak.json"),
        help="JSON record; the PNG goes next to it with the same name",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress indicator")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error(f"--n must be >= 1, got {args.n}")
    if args.window < 1:
        ap.error(f"--window must be >= 1, got {args.window}")
    if args.warmup < 0 or args.warmup + 2 * args.window > args.n:
        ap.error(f"--n ({args.n}) must be at least --warmup + 2 * --window ({args.warmup} + 2 * {args.window})")
    if args.gen_length < 1:
        ap.error(f"--gen-length must be >= 1, got {args.gen_length}")

    from blockbatch.bench import environment
    from blockbatch.engine import Engine
    from blockbatch.options import DecodeOptions
    from blockbatch.toy.task import make_problems

    torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.model)
    variants = [
        (name, DecodeOptions(gen_length=args.gen_length, seed=i, **fields))
        for i, (name, fields) in enumerate(mix(args.gen_length))
    ]
    prompts = [p.prompt for p in make_problems(args.n, seed=args.seed, split="test", unique=False)]

    rss: list[int] = []
    per_variant = {name: {"count": 0, "nfe": [], "ms": []} for name, _ in variants}
    bar = Progress(args.n, args.quiet)
    rss_start = rss_bytes()
    t_start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        name, options = variants[i % len(variants)]
        t0 = time.perf_counter()
        [gen] = engine.generate(prompt, options)
        rec = per_variant[name]
        rec["count"] += 1
        rec["nfe"].append(gen.stats["nfe"])
        rec["ms"].append((time.perf_counter() - t0) * 1e3)
        rss.append(rss_bytes())
        bar.update(rss[-1])
    bar.close()
    wall = time.perf_counter() - t_start

    after = rss[args.warmup :]
    baseline = statistics.median(after[: args.window])
    end = statistics.median(after[-args.window :])
    growth = end / baseline - 1
    verdict = {
        "passed": growth < args.max_growth,
        "growth": growth,
        "max_growth": args.max_growth,
        "baseline_rss_bytes": baseline,
        "end_rss_bytes": end,
        "max_rss_bytes_after_warmup": max(after),
        "rss_before_first_decode_bytes": rss_start,
        "slope_bytes_per_decode_after_warmup": slope(after),
    }
    record = {
        "benchmark": "soak",
        "environment": environment(),
        "wall_s": wall,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quiet")},
        "variants": {
            name: {
                "options": {
                    k: getattr(o, k)
                    for k in (
                        "policy",
                        "block_length",
                        "threshold",
                        "factor",
                        "steps",
                        "temperature",
                        "block_sizes",
                        "refresh_mode",
                        "refresh_tokens",
                    )
                },
                "count": per_variant[name]["count"],
                "mean_nfe": statistics.fmean(per_variant[name]["nfe"]) if per_variant[name]["nfe"] else None,
                "median_ms": statistics.median(per_variant[name]["ms"]) if per_variant[name]["ms"] else None,
            }
            for name, o in variants
        },
        "verdict": verdict,
        "rss_bytes": rss,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    png = plot(os.path.splitext(args.out)[0] + ".png", rss, args.warmup, args.window, verdict)

    print(
        f"{args.n} decodes in {wall:.1f} s ({len(variants)} variants, gen_length {args.gen_length}, "
        f"{args.threads} thread(s))"
    )
    for name, v in record["variants"].items():
        print(f"  {name:22s} {v['count']:4d} decodes  mean NFE {v['mean_nfe']:6.2f}  median {v['median_ms']:7.2f} ms")
    print(
        f"RSS after warm-up: baseline {baseline / 2**20:.2f} MiB -> end {end / 2**20:.2f} MiB "
        f"({growth:+.3%}, limit {args.max_growth:.0%}); slope {verdict['slope_bytes_per_decode_after_warmup']:+.0f} "
        f"bytes/decode; max {max(after) / 2**20:.2f} MiB"
    )
    print(f"wrote {args.out}" + (f" and {png}" if png else ""))
    if not verdict["passed"]:
        print(f"FAIL: RSS grew {growth:+.3%} after warm-up (limit {args.max_growth:.0%})", file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
