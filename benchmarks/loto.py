"""Presets that hold one task away: a BlockBatch setting chosen leave-one-task-out.

    python benchmarks/loto.py [--models toy,dream] [--gen-lengths 64,128] [--n 50] [--max-drop 0.01]
        [--parity-models LABEL=DIR,...] [--sweeps results/loto] [--out docs/bench/loto/loto.json]
        [--threads 1] [--report-only]

The task families (written under --sweeps; each decoded on every model at every gen length):

    arith        the toy's chained arithmetic, 2..6 operations (held-out problems, seed 11)
    arith-short  2..3 operations (seed 12)
    arith-long   5..6 operations (seed 13)
    arith-high   chains starting at 80..99, their totals near the top of the range (seed 14)
    lm-eval      an lm-evaluation-harness task (a YAML and its data under --sweeps, --include-path):
                 the toy's problems (seed 15), scored by the harness's exact_match of the WHOLE
                 response (every running total and the answer), not only the answer

    parity       another skill: running parity of 8..16 bits (blockbatch.toy.parity, seed 16), the
                 whole trace checked exactly; only on the models of --parity-models, trained for it
                 (``tools/train_toy.py --task parity --out DIR``), as the arithmetic toys cannot do it

The arith tasks are task files (``{"prompt", "answer"}`` lines) checked by
``--answer-regex ';(\\d+)\\s*$'`` (the answer after the last ``;``, as the toy's own check). None
of them is the problem set the built-in presets were tuned on (the toy's seed-0 problems).

1. ``blockbatch tune`` per (model, gen length, task) over one grid (dual: blocks 16/32/64;
   BlockBatch: branch sets 4..128, 8..64, 16..128, 32..128; thresholds 0.9/0.8/0.7; merge gates
   0.5/0.9; sync_refresh off/on; refresh 32), modelled H200 time from docs/bench/gpu. A sweep
   already in --sweeps is resumed, not redone.
2. For each task T: one BlockBatch config (and one dual config) is chosen on every cell (model,
   gen length) of the OTHER tasks, pooled: each config's mean accuracy and mean modelled time relative to the cell's
   tuned dual (the dual config ``tune`` picks on that cell); among the configs within --max-drop
   of the best mean accuracy, the lowest mean relative time (``tune.choose``'s rule). Branch sets
   are matched by their nominal set (gen 64 cuts 32/64/128 to 32/64).
3. On T's cells it is reported beside T's own tuned dual (chosen on T itself: the strongest dual
   there is), the dual chosen on the other tasks, the paper's settings (``blockbatch-paper``) and
   the built-in ``blockbatch-best``: accuracy, mean NFE, modelled H200 ms and CPU ms per task. A
   tally over the held-out cells counts, per setting, where it is as accurate as each dual (within
   --max-drop) and faster, as accurate and slower, or less accurate. The config chosen on ALL the
   tasks is reported too (the candidate for a built-in preset, validated by the held-out runs).

Writes the JSON, a PNG (per held-out cell: each BlockBatch setting's accuracy and modelled time
against the cell's tuned dual) next to it; docs/benchmarks.md renders its table from the JSON
(tools/gen_docs_bench.py). ``--report-only`` redoes steps 2 and 3 from the sweeps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from common import environment, write_json, write_png

from blockbatch import tune
from blockbatch.toy import task as toy_task

BRANCH_SETS = ((4, 8, 16, 32, 64, 128), (8, 16, 32, 64), (16, 32, 64, 128), (32, 64, 128))
GRID_FLAGS = [
    "--policies",
    "dual,blockbatch",
    "--block-lengths",
    "16,32,64",
    "--thresholds",
    "0.9,0.8,0.7",
    "--branch-sets",
    " ".join("/".join(map(str, s)) for s in BRANCH_SETS),
    "--merge-gates",
    "0.5,0.9",
    "--sync-refresh",
    "off,on",
    "--refresh",
    "32",
]
PAPER = "blockbatch:block_sizes=4/8/16/32/64/128,threshold=0.9,merge_gate=0.5,refresh_tokens=32"
BEST = "blockbatch:block_sizes=32/64/128,threshold=0.9,merge_gate=0.9,refresh_tokens=32,sync_refresh=true"
ANSWER_REGEX = r";(\d+)\s*$"
TASKS = ("arith", "arith-short", "arith-long", "arith-high", "lm-eval")  # the arithmetic models' tasks
PARITY = "parity"  # blockbatch.toy.parity, on models trained for it (--parity-models)
LM_EVAL_NAME = "blockbatch_loto_trace"


def _problems(name: str, n: int) -> list[toy_task.Problem]:
    if name == "arith":
        return toy_task.make_problems(n, 11, "test")
    if name == "arith-short":
        return toy_task.make_problems(n, 12, "test", min_ops=2, max_ops=3)
    if name == "arith-long":
        return toy_task.make_problems(n, 13, "test", min_ops=5, max_ops=6)
    if name == "arith-high":
        return toy_task.take((p for p in toy_task.iter_problems(14, "test") if p.start >= 80), n)
    if name == "lm-eval":
        return toy_task.make_problems(n, 15, "test")
    raise ValueError(f"unknown task {name!r}")


def write_tasks(folder: str, n: int) -> dict[str, list[str]]:
    """The task files (and the lm-eval task's YAML and data); the tune flags naming each task."""
    os.makedirs(folder, exist_ok=True)
    from blockbatch.toy import parity

    path = os.path.join(folder, f"{PARITY}.jsonl")
    with open(path, "w", encoding="utf-8") as f:  # the answer is the whole trace, checked exactly
        f.writelines(json.dumps({"prompt": p.prompt, "answer": p.response}) + "\n" for p in parity.make_problems(n, 16))
    flags = {PARITY: ["--tasks", path]}
    for name in TASKS:
        problems = _problems(name, n)
        if name == "lm-eval":
            lm = os.path.join(folder, "lm_eval_task")
            os.makedirs(lm, exist_ok=True)
            with open(os.path.join(lm, "data.jsonl"), "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"prompt": p.prompt, "response": p.response}) + "\n" for p in problems)
            with open(os.path.join(lm, "loto_data.py"), "w", encoding="utf-8") as f:
                f.write(
                    "import json, os\n\nimport datasets\n\n\ndef load(**_):\n"
                    "    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data.jsonl')\n"
                    "    with open(path, encoding='utf-8') as f:\n"
                    "        rows = [json.loads(line) for line in f if line.strip()]\n"
                    "    return datasets.DatasetDict({'test': datasets.Dataset.from_list(rows)})\n"
                )
            with open(os.path.join(lm, "loto.yaml"), "w", encoding="utf-8") as f:
                f.write(
                    f"task: {LM_EVAL_NAME}\ncustom_dataset: !function loto_data.load\ntest_split: test\n"
                    'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{response}}"\n'
                    'generation_kwargs:\n  until: ["\\n"]\n  do_sample: false\nmetric_list:\n'
                    "  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
                    "metadata:\n  version: 1.0\n"
                )
            flags[name] = ["--lm-eval-task", LM_EVAL_NAME, "--include-path", lm]
        else:
            path = os.path.join(folder, f"{name}.jsonl")
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems)
            flags[name] = ["--tasks", path, "--answer-regex", ANSWER_REGEX]
    return flags


def _model_path(name: str) -> str | None:
    from blockbatch.toy import CHECKPOINT_DIR, DREAM_CHECKPOINT_DIR

    return {"toy": CHECKPOINT_DIR, "dream": DREAM_CHECKPOINT_DIR}.get(name, name)


def sweep(model: str, G: int, task: str, flags: list[str], args, label: str | None = None) -> dict:
    out = os.path.join(args.sweeps, label or model, str(G), task)
    cmd = [sys.executable, "-m", "blockbatch.cli", "tune", "--model", _model_path(model), "--gen-length", str(G)]
    cmd += ["--n", str(args.n), "--out", out, "--step-time", args.step_time, "--threads", str(args.threads)]
    cmd += GRID_FLAGS + flags + ["--quiet"]
    if not args.report_only:
        print(f"== tune {model} gen {G} {task}", file=sys.stderr, flush=True)
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(os.path.join(out, "tune.json"), encoding="utf-8") as f:
        return json.load(f)["configs"]


def nominal(spec: str) -> str:
    """A spec with its branch set as the grid named it (gen 64 cuts 32/64/128 to 32/64)."""
    m = re.search(r"block_sizes=([\d/]+)", spec)
    if not m:
        return spec
    kept = tuple(int(x) for x in m.group(1).split("/"))
    for s in BRANCH_SETS:
        if tuple(b for b in s if b in kept) == kept and all(b in kept or b > max(kept) for b in s):
            return spec.replace(m.group(0), "block_sizes=" + "/".join(map(str, s)))
    return spec


def points(configs: dict) -> dict[str, dict]:
    return {
        nominal(name): {
            "accuracy": c["accuracy"],
            "mean_nfe": c["mean_nfe"],
            "mean_model_ms": c["mean_model_ms"],
            "mean_query_tokens": c["mean_query_tokens"],
            "mean_wall_ms": c["mean_wall_ms"],
        }
        for name, c in configs.items()
    }


def duals(cells: dict[tuple[str, int, str], dict], max_drop: float) -> dict:
    """Each cell's tuned dual: the dual config ``tune`` picks there (modelled time)."""
    return {k: tune.choose(p, "mean_model_ms", max_drop, policy="dual") for k, p in cells.items()}


def choose_on(cells: dict, train: list, max_drop: float, policy: str = "blockbatch") -> tuple[str, dict]:
    """The ``policy`` config of ``tune.choose``'s rule over the ``train`` cells pooled: mean
    accuracy, mean modelled time relative to each cell's tuned dual."""
    dual = duals(cells, max_drop)
    names = set.intersection(*(set(cells[k]) for k in train))
    pooled = {
        n: {
            "accuracy": sum(cells[k][n]["accuracy"] for k in train) / len(train),
            "rel_time": sum(cells[k][n]["mean_model_ms"] / cells[k][dual[k]]["mean_model_ms"] for k in train)
            / len(train),
            "mean_query_tokens": sum(cells[k][n]["mean_query_tokens"] for k in train) / len(train),
        }
        for n in names
    }
    chosen = tune.choose(pooled, "rel_time", max_drop, policy=policy)
    assert chosen is not None
    return chosen, pooled[chosen]


def loto(cells: dict[tuple[str, int, str], dict], max_drop: float) -> dict:
    """Per held-out task: the config chosen on the others and every setting's score on it."""
    dual = duals(cells, max_drop)
    out = {}
    for held in sorted({k[2] for k in cells}, key=lambda t: (t == PARITY, t)):
        train = [k for k in cells if k[2] != held]
        chosen, on_others = choose_on(cells, train, max_drop)
        dual_loto, _ = choose_on(cells, train, max_drop, policy="dual")
        rows = []
        for k in sorted(k for k in cells if k[2] == held):
            p = cells[k]
            row = {"model": k[0], "gen_length": k[1], "task": held}
            settings = (("dual", dual[k]), ("loto", chosen), ("dual_loto", dual_loto), ("paper", PAPER), ("best", BEST))
            for label, name in settings:
                row[label] = {"config": name, **p[name]}
            rows.append(row)
        out[held] = {"chosen": chosen, "chosen_on_others": on_others, "cells": rows}
    return out


def tally(result: dict, max_drop: float, against: str) -> dict:
    """Per setting, over every held-out cell, against the cell's ``against`` setting ("dual": the
    dual tuned on the task; "dual_loto": the dual chosen on the other tasks): how often it is
    within ``max_drop`` of that accuracy and faster (modelled H200), within and slower, or less
    accurate; the accuracy given up where it is, the time ratios where it is not."""
    out = {}
    for label in ("loto", "dual_loto", "paper", "best"):
        if label == against:
            continue
        t: dict = {"faster": 0, "slower": 0, "less_accurate": 0, "accuracy_lost": [], "time_ratio_when_as_accurate": []}
        for r in result.values():
            for c in r["cells"]:
                a, d = c[label], c[against]
                ratio = a["mean_model_ms"] / d["mean_model_ms"]
                if a["accuracy"] < d["accuracy"] - max_drop - 1e-12:
                    t["less_accurate"] += 1
                    t["accuracy_lost"].append(round(d["accuracy"] - a["accuracy"], 4))
                else:
                    t["faster" if ratio < 1 else "slower"] += 1
                    t["time_ratio_when_as_accurate"].append(round(ratio, 4))
        out[label] = t
    return out


def frontiers(cells: dict[tuple[str, int, str], dict]) -> list[dict]:
    """Each cell's accuracy / modelled-time frontier (folding on, as every sweep ran)."""
    out = []
    for (model, G, task_name), p in sorted(cells.items()):
        names = tune.frontier(p, "mean_model_ms")
        out.append(
            {"model": model, "gen_length": G, "task": task_name, "frontier": [{"config": n, **p[n]} for n in names]}
        )
    return out


def summary(result: dict) -> str:
    """One line per held-out cell (docs/benchmarks.md renders the table from the JSON)."""
    lines = []
    for held, r in result.items():
        lines.append(f"left out {held}: chose {r['chosen']}")
        for c in r["cells"]:
            a, d = c["loto"], c["dual"]
            lines.append(
                f"  {c['model']} gen {c['gen_length']}: {a['accuracy']:.2f} at {a['mean_nfe']:.2f} NFE, "
                f"{a['mean_model_ms']:.1f} ms; tuned dual {d['accuracy']:.2f} at {d['mean_nfe']:.2f} NFE, "
                f"{d['mean_model_ms']:.1f} ms"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="toy,dream", help="toy (LLaDA toy), dream (Dream toy) or checkpoint folders")
    p.add_argument("--gen-lengths", default="64,128")
    p.add_argument("--n", type=int, default=50, help="tasks per task family")
    p.add_argument("--max-drop", type=float, default=0.01)
    p.add_argument("--step-time", default=os.path.join("docs", "bench", "gpu", "bench_gpu_step.json"))
    p.add_argument("--sweeps", default=os.path.join("results", "loto"))
    p.add_argument("--out", default=os.path.join("docs", "bench", "loto", "loto.json"))
    p.add_argument(
        "--parity-models",
        default="",
        metavar="LABEL=DIR,...",
        help="models trained on the parity task (tools/train_toy.py --task parity --out DIR), swept on it",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--report-only", action="store_true", help="no decoding: the report from the sweeps there")
    args = p.parse_args(argv)
    flags = write_tasks(os.path.join(args.sweeps, "tasks"), args.n)
    cells = {}
    gens = [int(g) for g in args.gen_lengths.split(",")]
    for model in args.models.split(","):
        for G in gens:
            for t in TASKS:
                cells[(model, G, t)] = points(sweep(model, G, t, flags[t], args))
    for entry in filter(None, args.parity_models.split(",")):
        label, _, path = entry.partition("=")
        for G in gens:
            cells[(label, G, PARITY)] = points(sweep(path, G, PARITY, flags[PARITY], args, label))
    result = loto(cells, args.max_drop)
    everything, on_all = choose_on(cells, list(cells), args.max_drop)
    payload = {
        "benchmark": "loto",
        "args": vars(args),
        "environment": environment(),
        "grid": GRID_FLAGS,
        "result": result,
        "tally": {against: tally(result, args.max_drop, against) for against in ("dual", "dual_loto")},
        "chosen_on_all_tasks": {"config": everything, **on_all},
        "frontiers": frontiers(cells),
    }
    write_json(args.out, payload)
    print(summary(result))
    print(f"chosen on all tasks: {everything}")

    def draw(ax):
        rows = [row for r in result.values() for row in r["cells"]]
        names = {"loto": "BlockBatch chosen on the others", "dual_loto": "dual chosen on the others"}
        for label, marker in (("loto", "o"), ("dual_loto", "s"), ("paper", "^"), ("best", "x")):
            xs = [row[label]["mean_model_ms"] / row["dual"]["mean_model_ms"] for row in rows]
            ys = [row[label]["accuracy"] - row["dual"]["accuracy"] for row in rows]
            ax.scatter(xs, ys, marker=marker, label=names.get(label, label), alpha=0.7)
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(1, color="grey", lw=0.5)
        ax.set_xlabel("modelled H200 time / the task's tuned dual")
        ax.set_ylabel("accuracy - the task's tuned dual")
        ax.set_title("held-out cells (task, model, gen length); upper left: beats the dual", fontsize=8)
        ax.legend(fontsize=7)

    write_png(args.out, draw, size=(6, 4.5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
