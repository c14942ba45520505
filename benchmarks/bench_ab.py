"""Two builds of blockbatch side by side: bench_batch.py run against each, in turn, in one run.

    python benchmarks/bench_ab.py --baseline DIR [--rounds 3] [--out results/bench_ab.json] -- [bench_batch args]

DIR is another checkout with its native module built in place (``python setup.py build_ext --inplace``;
e.g. ``git worktree add /tmp/base main``). Each round runs this checkout's bench_batch.py once with
the baseline's package first on PYTHONPATH (A) and once with this checkout's (B), alternating
A B A B ... so that a drift of this shared machine hits both alike; the bench_batch arguments after
``--`` go to every run (``--repeats`` is set to 1: the rounds are the repeats). Per policy and
setting (one by one, each max_batch) the JSON gives A's and B's median seconds, the ratio B / A of
each round and their median (below 1: B is faster), and whether B's batched tokens still equal its
one-by-one run. Writes the JSON and a PNG (B / A by max_batch) next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import write_json, write_png

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(package_root: str, args: list[str], out: str) -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.path.join(package_root, "python") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    cmd = [sys.executable, os.path.join(HERE, "bench_batch.py"), *args, "--repeats", "1", "--out", out]
    done = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"error: {' '.join(cmd)} (PYTHONPATH {package_root}/python) exited {done.returncode}:\n"
            f"{done.stdout[-4000:]}"
        )
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, bench = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the other checkout (A), its native module built in place")
    ap.add_argument("--rounds", type=int, default=3, help="A B rounds (default 3)")
    ap.add_argument("--out", default="results/bench_ab.json")
    args = ap.parse_args(own)
    base = os.path.abspath(args.baseline)
    if not os.path.isdir(os.path.join(base, "python", "blockbatch")):
        ap.error(f"--baseline {args.baseline}: no python/blockbatch there (a checkout of this project is expected)")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if "--repeats" in bench or "--out" in bench:
        ap.error("--repeats and --out are this script's (rounds, its own JSON); leave them out after --")
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    # The report is rewritten after every whole round: Ctrl-C keeps the rounds finished so far.
    try:
        with tempfile.TemporaryDirectory(prefix="bb-ab-") as tmp:
            for r in range(args.rounds):
                for side, root in (("A", base), ("B", ROOT)):
                    runs[side].append(_run(root, bench, os.path.join(tmp, f"{side}{r}.json")))
                    print(f"round {r + 1}/{args.rounds} {side} done", file=sys.stderr, flush=True)
                _report(args, argv, base, runs)
    except KeyboardInterrupt:
        print(f"interrupted: {min(len(runs['A']), len(runs['B']))} whole rounds in {args.out}", file=sys.stderr)
        return 130
    return 0


def _report(args, argv, base: str, runs: dict[str, list[dict]]) -> None:
    done = min(len(runs["A"]), len(runs["B"]))
    runs = {side: rows[:done] for side, rows in runs.items()}
    first = runs["B"][0]
    report = {
        "command": " ".join(["python", "benchmarks/bench_ab.py", *argv]),
        "baseline": base,
        "this": ROOT,
        "rounds": done,
        "model": first["model"],
        "n": first["n"],
        "gen_length": first["gen_length"],
        "threads": first["threads"],
        "environment": first["environment"],
        "policies": {},
    }
    for policy, rows in first["policies"].items():
        out = {}
        for setting in rows:
            if setting != "one_by_one" and not setting.startswith("batch_"):
                continue
            a = [run["policies"][policy][setting]["seconds"] for run in runs["A"]]
            b = [run["policies"][policy][setting]["seconds"] for run in runs["B"]]
            ratios = [y / x for x, y in zip(a, b)]
            out[setting] = {
                "A_median_s": statistics.median(a),
                "B_median_s": statistics.median(b),
                "B_over_A_per_round": ratios,
                "B_over_A_median": statistics.median(ratios),
            }
            if setting.startswith("batch_"):
                out[setting]["B_equal_to_one_by_one"] = [
                    run["policies"][policy][setting]["equal_to_one_by_one"] for run in runs["B"]
                ]
            print(
                f"{policy} {setting}: A {out[setting]['A_median_s']:.3f} s, B {out[setting]['B_median_s']:.3f} s, "
                f"B/A {out[setting]['B_over_A_median']:.3f} ({done} rounds)",
                flush=True,
            )
        report["policies"][policy] = out
    write_json(args.out, report)

    def draw(ax) -> None:
        for policy, out in report["policies"].items():
            batches = sorted(int(k.removeprefix("batch_")) for k in out if k.startswith("batch_"))
            ax.plot(batches, [out[f"batch_{b}"]["B_over_A_median"] for b in batches], marker="o", label=policy)
        ax.axhline(1.0, ls="--", lw=1, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_batch")
        ax.set_ylabel("seconds B / A (median of rounds)")
        ax.set_title(f"{report['model']}, {report['n']} requests, {done} rounds")
        ax.legend(fontsize=8)

    write_png(args.out, draw)


if __name__ == "__main__":
    sys.exit(main())
