"""``blockbatch tune``: sweep decode settings on a task set, draw the accuracy-NFE-time frontier,
write the chosen setting as a preset.

Every setting ("config") is a policy spec as ``blockbatch bench`` takes it
(``dual:block_length=64,threshold=0.8``, ``blockbatch:block_sizes=16/32/64,merge_gate=0.9``).
Each is decoded on every task; per config: accuracy, mean NFE, mean query tokens per sample,
measured wall time per sample and the time a step-time model gives (``blockbatch.steptime``:
measured on this machine, or loaded with ``--step-time FILE``, e.g. the H200 step benchmark,
so a CPU sweep can be read in GPU time).

Accuracy: exact match against the task's answers (the toy task: its answer check); a task
file without answers is scored by agreement with a slow reference decode (vanilla, one token
per step), decoded once and kept in the JSON.

The sweep writes ``tune.json`` after every config (atomically): a rerun with the same model,
tasks, n and gen_length skips what is done (``--fresh`` starts over), Ctrl-C and
``--time-budget`` stop between configs and lose nothing. The frontier: configs that no other
config beats on both accuracy (higher) and cost (lower mean NFE, or time with
``--objective time``). The choice: among configs within ``--max-drop`` of the best accuracy
(of every config swept), the cheapest (``--pick-policy`` restricts the candidates).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import statistics
import sys
import time
from typing import Sequence

FORMAT = 1
OBJECTIVES = ("nfe", "time")


# --------------------------------------------------------------------------- the grid

@dataclasses.dataclass(frozen=True)
class Grid:
    policies: tuple[str, ...] = ("dual", "blockbatch")
    block_lengths: tuple[int, ...] = (16, 32, 64)          # dual / prefix
    thresholds: tuple[float, ...] = (0.95, 0.9, 0.8, 0.7)
    branch_sets: tuple[tuple[int, ...], ...] = ((4, 8, 16, 32, 64, 128), (8, 16, 32, 64), (16, 32, 64, 128),
                                                (32, 64, 128))
    merge_gates: tuple[float, ...] = (0.5, 0.9)
    eos_exit: tuple[bool, ...] = (True,)
    refresh: tuple[str, ...] = ("32",)  # refresh_tokens; "block": the smallest branch (every branch refreshes
    #                                     at each of its own block boundaries)
    sync_refresh: tuple[bool, ...] = (False, True)  # the variant of ALGORITHMS.md 10.3


GRIDS = {
    "small": Grid(thresholds=(0.9, 0.8, 0.7), branch_sets=((4, 8, 16, 32, 64, 128), (16, 32, 64, 128), (32, 64, 128)),
                  sync_refresh=(True,)),
    "default": Grid(),
    "full": Grid(policies=("prefix", "dual", "blockbatch"), thresholds=(0.95, 0.9, 0.85, 0.8, 0.7, 0.6),
                 merge_gates=(0.5, 0.7, 0.9), eos_exit=(True, False), refresh=("16", "32", "64", "block")),
}


def _fmt(x: float) -> str:
    return f"{x:g}"


def configs(grid: Grid, gen_length: int) -> list[str]:
    """The policy specs of a grid, for one gen_length (block sizes that do not divide it are left
    out, duplicate branch sets once). Ordered coarse to fine, policies interleaved, so a sweep
    cut short by its time budget has still covered every policy around the paper's settings."""
    per_policy: dict[str, list[tuple[float, str]]] = {}
    for policy in grid.policies:
        rows: list[tuple[float, str]] = []
        if policy in ("dual", "prefix"):
            for bl in grid.block_lengths:
                if gen_length % bl:
                    continue
                for t in grid.thresholds:
                    rows.append((abs(t - 0.9) + abs(bl - 32) / 320, f"{policy}:block_length={bl},threshold={_fmt(t)}"))
        elif policy == "blockbatch":
            seen = set()
            for sizes in grid.branch_sets:
                kept = tuple(b for b in sizes if gen_length % b == 0 and b <= gen_length)
                if not kept or kept in seen:
                    continue
                seen.add(kept)
                for t in grid.thresholds:
                    for g in grid.merge_gates:
                        for eos in grid.eos_exit:
                            for r in grid.refresh:
                                refresh = min(kept) if r == "block" else int(r)
                                if r == "block" and refresh == 32 and "32" in grid.refresh:
                                    continue
                                for sr in grid.sync_refresh:
                                    spec = (f"blockbatch:block_sizes={'/'.join(map(str, kept))},threshold={_fmt(t)},"
                                            f"merge_gate={_fmt(g)},refresh_tokens={refresh}")
                                    if not eos:
                                        spec += ",stop_on_eos=false"
                                    if sr:
                                        spec += ",sync_refresh=true"
                                    rank = abs(t - 0.9) + abs(g - 0.5) / 4 + (0 if eos else 0.05) + \
                                        (0 if refresh == 32 else 0.02) + len(seen) * 0.01 + (0.005 if sr else 0)
                                    rows.append((rank, spec))
        elif policy == "vanilla":
            rows.append((0.0, "vanilla"))
        else:
            raise ValueError(f"policies: {policy!r} is not one of vanilla, prefix, dual, blockbatch")
        per_policy[policy] = [s for _, s in sorted(rows, key=lambda r: r[0])]
    out, i = [], 0
    while any(i < len(v) for v in per_policy.values()):
        out += [v[i] for v in per_policy.values() if i < len(v)]
        i += 1
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------- frontier and choice

def frontier(points: dict[str, dict], cost: str) -> list[str]:
    """Names of the configs no other config beats (accuracy >= and cost <=, one of them strictly),
    by increasing cost."""
    names = []
    for n, p in points.items():
        if not any(q["accuracy"] >= p["accuracy"] and q[cost] <= p[cost]
                   and (q["accuracy"] > p["accuracy"] or q[cost] < p[cost]) for m, q in points.items() if m != n):
            names.append(n)
    return sorted(names, key=lambda n: (points[n][cost], -points[n]["accuracy"]))


def choose(points: dict[str, dict], cost: str, max_drop: float, policy: str | None = None) -> str | None:
    """Among configs (of ``policy`` when given) within ``max_drop`` of the best accuracy of all
    configs, the cheapest; ties: the more accurate, then the name."""
    if not points:
        return None
    best = max(p["accuracy"] for p in points.values())
    cands = [n for n, p in points.items() if p["accuracy"] >= best - max_drop - 1e-12
             and (policy is None or n.partition(":")[0] == policy)]
    if not cands and policy is not None:  # none of that policy close enough: its most accurate, cheapest
        own = {n: p for n, p in points.items() if n.partition(":")[0] == policy}
        if not own:
            return None
        top = max(p["accuracy"] for p in own.values())
        cands = [n for n, p in own.items() if p["accuracy"] == top]
    return min(cands, key=lambda n: (points[n][cost], -points[n]["accuracy"], n))


# --------------------------------------------------------------------------- the sweep

def _setup_key(model: str, tasks: str, samples: list, n: int, gen_length: int) -> dict:
    h = hashlib.sha256("\n".join(s.prompt for s in samples).encode()).hexdigest()[:16]
    return {"model": model, "tasks": tasks, "n": n, "gen_length": gen_length, "prompts_sha256": h}


def _write_json(path: str, data: dict) -> None:
    from .errors import write_json_file

    write_json_file(path, data, indent=None)  # compact: it holds every task's step log


def summarize(records: list[dict]) -> dict:
    return {
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "mean_nfe": statistics.mean(r["nfe"] for r in records),
        "mean_query_tokens": statistics.mean(r["query_tokens"] for r in records),
        "mean_wall_ms": statistics.mean(r["wall_ms"] for r in records),
        "median_wall_ms": statistics.median(r["wall_ms"] for r in records),
    }


class _Bar:
    """tqdm when installed, else a plain stderr line."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        self.total, self.done, self.enabled, self.t0 = total, 0, enabled, time.perf_counter()
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="decode", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, k: int, label: str) -> None:
        self.done += k
        if self.bar is not None:
            self.bar.set_description(label[:48], refresh=False)
            self.bar.update(k)
        elif self.enabled:
            el = time.perf_counter() - self.t0
            eta = el / max(self.done, 1) * (self.total - self.done)
            sys.stderr.write(f"\r[{self.done}/{self.total}] {el:.0f}s elapsed, ETA {eta:.0f}s  {label[:48]:48s}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            sys.stderr.write("\n")


def run_tune(engine, samples: list, specs: Sequence[str], gen_length: int, out_path: str, setup: dict,
             step_model, time_budget_s: float | None = None, progress: bool = True, fresh: bool = False,
             max_batch: int = 1) -> dict:
    """Decode every sample with every config, saving ``out_path`` after each config; returns the
    JSON's contents. A config already in an existing ``out_path`` with the same setup is skipped."""
    from . import bench

    data = None
    if os.path.exists(out_path) and not fresh:
        try:
            with open(out_path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{out_path}: cannot resume from it ({e}); pass --fresh to start over") from None
        if data.get("tune") != FORMAT or data.get("setup") != setup:
            raise ValueError(f"{out_path}: holds a sweep of another setup ({json.dumps(data.get('setup'))}); pass "
                             f"--fresh to overwrite it or choose another --out")
    if data is None:
        data = {"tune": FORMAT, "setup": setup, "environment": bench.environment(), "reference": None,
                "configs": {}}
    data["step_time"] = step_model.to_dict()
    options = {spec: bench.policy_options(spec, gen_length) for spec in specs}  # bad spec: error before decoding
    encoded = [engine.encode(s.prompt) for s in samples]
    scored_by = "answers" if all(s.check is not None for s in samples) else "reference"
    data["scored_by"] = scored_by
    todo = [s for s in specs if s not in data["configs"]]
    need_ref = scored_by == "reference" and data.get("reference") is None
    bar = _Bar(len(samples) * (len(todo) + need_ref), progress)
    t0 = time.perf_counter()
    stopped = None
    try:
        if need_ref:
            ref_opts = bench.policy_options("vanilla", gen_length)
            ref = []
            for ids in encoded:
                [g] = engine.generate(ids, ref_opts)
                ref.append(g.ids)
                bar.update(1, "reference (vanilla, 1 token/step)")
            data["reference"] = {"policy": "vanilla", "ids": ref}
            _write_json(out_path, data)
        for k, spec in enumerate(todo):
            # at least one config per run, so that reruns always make progress
            if k and time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                stopped = "time budget"
                break
            o = options[spec]
            records = []
            gens = []
            if max_batch > 1:
                start = time.perf_counter()
                gens = engine.generate(encoded, o, max_batch=max_batch)
                per = (time.perf_counter() - start) * 1e3 / len(encoded)
                walls = [per] * len(encoded)
                bar.update(len(encoded), spec)
            else:
                walls = []
                for ids in encoded:
                    start = time.perf_counter()
                    [g] = engine.generate(ids, o)
                    walls.append((time.perf_counter() - start) * 1e3)
                    gens.append(g)
                    bar.update(1, spec)
            for i, (g, wall) in enumerate(zip(gens, walls)):
                if scored_by == "answers":
                    correct = bool(samples[i].check(g.text))
                else:
                    correct = g.ids == data["reference"]["ids"][i]
                L = encoded[i].numel() + gen_length
                q = g.stats["query_tokens_per_step"]
                records.append({"correct": correct, "nfe": g.stats["nfe"], "query_tokens": sum(q), "wall_ms": wall,
                                "steps": q, "length": L})
            data["configs"][spec] = {"policy": o.policy, "options": _options_dict(o), **summarize(records),
                                     "correct": [r["correct"] for r in records], "nfe": [r["nfe"] for r in records],
                                     "query_tokens_per_step": [r["steps"] for r in records],
                                     "lengths": [r["length"] for r in records]}
            _model_config(data["configs"][spec], step_model)
            _write_json(out_path, data)
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        bar.close()
    data["stopped"] = stopped
    data["remaining"] = [s for s in specs if s not in data["configs"]]
    remodel(data, step_model)
    _write_json(out_path, data)
    return data


def remodel(data: dict, step_model) -> None:
    """Every config's modelled time under ``step_model`` (from the step logs kept per sample), so a
    sweep resumed or re-read with another ``--step-time`` is in one time throughout."""
    data["step_time"] = step_model.to_dict()
    for rec in data["configs"].values():
        _model_config(rec, step_model)


def _model_config(rec: dict, step_model) -> None:
    """A config's mean modelled ms per task, from its tasks' step logs."""
    ms = [step_model.decode_seconds(q, L) * 1e3 for q, L in zip(rec["query_tokens_per_step"], rec["lengths"])]
    rec["mean_model_ms"] = statistics.mean(ms)


def _options_dict(o) -> dict:
    from . import contract

    return {n: (list(v) if isinstance(v, tuple) else v) for n in contract.NAMES for v in [getattr(o, n)]
            if v != contract.DEFAULTS[n] or n in ("policy", "gen_length")}


# --------------------------------------------------------------------------- report

def cost_key(objective: str) -> str:
    return {"nfe": "mean_nfe", "time": "mean_model_ms"}[objective]


def format_report(data: dict, objective: str, chosen: str | None, limit: int = 40) -> str:
    pts = data["configs"]
    key = cost_key(objective)
    front = frontier(pts, key)
    lines = [f"{len(pts)} configs on {data['setup']['n']} tasks (accuracy by {data['scored_by']}); frontier by "
             f"{'mean NFE' if objective == 'nfe' else 'modelled time'} ({len(front)} configs):",
             f"  {'acc':>6} {'NFE':>6} {'q tok':>7} {'wall ms':>8} {'model ms':>9}  config"]
    for n in front[:limit]:
        p = pts[n]
        mark = "  <- chosen" if n == chosen else ""
        lines.append(f"  {p['accuracy']:6.3f} {p['mean_nfe']:6.2f} {p['mean_query_tokens']:7.0f} "
                     f"{p['mean_wall_ms']:8.2f} {p['mean_model_ms']:9.2f}  {n}{mark}")
    if chosen is not None and chosen not in front:
        p = pts[chosen]
        lines.append(f"  chosen (off this frontier): {p['accuracy']:.3f} acc, {p['mean_nfe']:.2f} NFE  {chosen}")
    lines.append(f"model time: {data['step_time']['source']}")
    return "\n".join(lines)


def save_plot(data: dict, path: str, chosen: str | None) -> str | None:
    """Accuracy vs mean NFE and vs modelled time per sample, one colour per policy, frontiers drawn."""
    from .bench import pyplot

    plt = pyplot()
    if plt is None:
        return None
    pts = data["configs"]
    colors = {"vanilla": "tab:gray", "prefix": "tab:green", "dual": "tab:blue", "blockbatch": "tab:red"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, key, label in ((axes[0], "mean_nfe", "mean NFE per sample"),
                           (axes[1], "mean_model_ms", f"modelled ms per sample\n({data['step_time']['source']})")):
        for policy in colors:
            sel = [p for n, p in pts.items() if p["policy"] == policy]
            if sel:
                ax.scatter([p[key] for p in sel], [p["accuracy"] for p in sel], s=22, alpha=0.7, c=colors[policy],
                           label=policy)
        for policy in ("dual", "blockbatch"):
            own = {n: p for n, p in pts.items() if p["policy"] == policy}
            f = frontier(own, key)
            if len(f) > 1:
                ax.step([own[n][key] for n in f], [own[n]["accuracy"] for n in f], where="post", c=colors[policy],
                        lw=1, alpha=0.6)
        f = frontier(pts, key)
        ax.step([pts[n][key] for n in f], [pts[n]["accuracy"] for n in f], where="post", c="k", lw=1.5,
                label="frontier (all)")
        if chosen in pts:
            ax.scatter([pts[chosen][key]], [pts[chosen]["accuracy"]], marker="*", s=220, c="gold", edgecolors="k",
                       zorder=5, label="chosen")
        ax.set_xlabel(label, fontsize=8 if key == "mean_model_ms" else 10)
        ax.set_ylabel("accuracy" if data["scored_by"] == "answers" else "agreement with one-token-per-step decode")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    setup = data["setup"]
    fig.suptitle(f"{os.path.basename(str(setup['model']).rstrip('/')) or setup['model']}: {setup['n']} tasks, "
                 f"gen_length {setup['gen_length']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- command line

def _floats(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by ',', got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one number")
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by ',', got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by ',', got {text!r}")
    return out


def _branch_sets(text: str) -> tuple[tuple[int, ...], ...]:
    sets = []
    for part in text.split():
        try:
            sizes = tuple(int(x) for x in part.split("/") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"branch sets are sizes joined by '/', separated by spaces "
                                             f"(e.g. '8/16/32/64 32/64'), got {part!r}") from None
        if not sizes or min(sizes) < 1:
            raise argparse.ArgumentTypeError(f"a branch set needs positive sizes, got {part!r}")
        sets.append(sizes)
    if not sets:
        raise argparse.ArgumentTypeError("expected at least one branch set")
    return tuple(sets)


def _on_off(text: str) -> tuple[bool, ...]:
    vals = {"on": True, "off": False, "true": True, "false": False}
    try:
        return tuple(dict.fromkeys(vals[x.strip().lower()] for x in text.split(",") if x.strip()))
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected on,off / on / off, got {text!r}") from None


def _refresh(text: str) -> tuple[str, ...]:
    out = []
    for x in (x.strip() for x in text.split(",")):
        if x == "block" or (x.isdigit() and int(x) >= 0):
            out.append(x)
        else:
            raise argparse.ArgumentTypeError(f"refresh values are token counts or 'block', got {x!r}")
    return tuple(out)


def add_parser(sub, positive_int, positive_float) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune", help="sweep decode settings on a task set: frontier JSON + PNG, the chosen setting as a preset",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__.split("\n\n")[0] + "\n\n" +
        "\n\n".join(__doc__.split("\n\n")[1:]),
        epilog="examples:\n"
               "  blockbatch tune --out results/tune                    (the toy model and toy tasks)\n"
               "  blockbatch tune --model DIR --tasks tasks.jsonl --n 200 --gen-length 128 --time-budget 3600\n"
               "  blockbatch tune --grid full --pick-policy blockbatch --write-preset my-best.json\n"
               "  blockbatch tune --step-time docs/bench/gpu/bench_gpu_step.json --objective time\n"
               "  blockbatch generate --preset results/tune/preset.json PROMPT   (use the choice)\n"
               "tasks: JSONL lines {\"prompt\": ..., \"answer\": ...}; without \"answer\" the score is agreement "
               "with a\nvanilla one-token-per-step decode. Rerun the same command to resume a sweep.")
    p.add_argument("--model", default=None, help="checkpoint folder (default: the shipped toy model)")
    p.add_argument("--tasks", default=None, help="JSONL of prompts (and answers) (default: the toy task's held-out "
                                                 "problems)")
    p.add_argument("--n", type=positive_int, default=100, help="tasks used (default 100)")
    p.add_argument("--gen-length", type=positive_int, default=64, help="generation length (default 64)")
    g = p.add_argument_group("the grid (each flag replaces that axis of --grid)")
    g.add_argument("--grid", choices=list(GRIDS), default="default",
                   help="small: ~25 configs; default: ~75; full: ~1000 (default default)")
    g.add_argument("--policies", type=lambda t: tuple(x for x in t.split(",") if x), default=None,
                   help="comma-separated: vanilla, prefix, dual, blockbatch")
    g.add_argument("--block-lengths", type=_ints, default=None, help="dual / prefix block lengths, e.g. 16,32,64")
    g.add_argument("--thresholds", type=_floats, default=None, help="e.g. 0.95,0.9,0.8")
    g.add_argument("--branch-sets", type=_branch_sets, default=None,
                   help="blockbatch branch sets, e.g. '4/8/16/32/64/128 16/32/64'")
    g.add_argument("--merge-gates", type=_floats, default=None, help="blockbatch merge gates, e.g. 0.5,0.9")
    g.add_argument("--eos-exit", type=_on_off, default=None, help="blockbatch EOS exit: on, off or on,off")
    g.add_argument("--refresh", type=_refresh, default=None,
                   help="blockbatch refresh_tokens values; 'block': the smallest branch size (e.g. 32,block)")
    g.add_argument("--sync-refresh", type=_on_off, default=None,
                   help="blockbatch sync_refresh variant: on, off or off,on")
    p.add_argument("--out", default="results/tune", help="output folder: tune.json, tune.png (tune_<FILE>.png with --step-time FILE), preset.json "
                                                         "(default results/tune)")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming --out's tune.json")
    p.add_argument("--time-budget", type=positive_float, default=None, metavar="SECONDS",
                   help="start no config after this many seconds (one at least; rerun to continue)")
    p.add_argument("--step-time", default="measure", metavar="FILE|measure",
                   help="step-time model: 'measure' (on this machine and model, ~3 s) or a JSON (a saved model, or "
                        "a GPU step benchmark JSON such as docs/bench/gpu/bench_gpu_step.json)")
    p.add_argument("--objective", choices=OBJECTIVES, default="nfe",
                   help="cost the frontier and the choice minimise: mean NFE or modelled time (default nfe)")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="accuracy the choice may give up against the best config swept (default 0.01)")
    p.add_argument("--pick-policy", default=None, choices=("vanilla", "prefix", "dual", "blockbatch"),
                   help="choose among this policy's configs only")
    p.add_argument("--write-preset", default=None, metavar="FILE",
                   help="where to write the chosen setting (default OUT/preset.json)")
    p.add_argument("--preset-name", default=None, help="the preset's name (default: tuned-<model>-<policy>)")
    p.add_argument("--max-batch", type=positive_int, default=1,
                   help="decode the tasks of a config N at a time (faster on a CPU; wall time is then per-sample "
                        "throughput; tokens and NFE do not change) (default 1)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=positive_int, default=None, help="intra-op threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=main_tune)
    return p


def main_tune(args: argparse.Namespace) -> int:
    import torch

    from . import bench, presets, steptime
    from .engine import Engine

    if args.threads:
        torch.set_num_threads(args.threads)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    base = GRIDS[args.grid]
    grid = dataclasses.replace(base, **{k: v for k, v in (
        ("policies", args.policies), ("block_lengths", args.block_lengths), ("thresholds", args.thresholds),
        ("branch_sets", args.branch_sets), ("merge_gates", args.merge_gates), ("eos_exit", args.eos_exit),
        ("refresh", args.refresh), ("sync_refresh", args.sync_refresh)) if v is not None})
    specs = configs(grid, args.gen_length)
    if not specs:
        raise ValueError(f"the grid has no config for --gen-length {args.gen_length} (no block length or branch set "
                         f"divides it)")
    samples = bench.load_tasks(args.tasks, args.n, answers_optional=True)
    if not samples:
        raise ValueError(f"--tasks {args.tasks}: the file holds no tasks")
    engine = Engine.from_pretrained(args.model, device=args.device)
    if args.step_time == "measure":
        L = max(engine.encode(s.prompt).numel() for s in samples) + args.gen_length
        step_model = steptime.measure(engine.model, lengths=(L, 2 * L))
    else:
        step_model = steptime.load(args.step_time)
    os.makedirs(args.out, exist_ok=True)
    out_json = os.path.join(args.out, "tune.json")
    setup = _setup_key(args.model or "toy", args.tasks or "toy", samples, args.n, args.gen_length)
    prev = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # save on kill too
    try:
        data = run_tune(engine, samples, specs, args.gen_length, out_json, setup, step_model, args.time_budget,
                        progress=not args.quiet, fresh=args.fresh, max_batch=args.max_batch)
    finally:
        signal.signal(signal.SIGTERM, prev)
    key = cost_key(args.objective)
    chosen = choose(data["configs"], key, args.max_drop, args.pick_policy)
    print(format_report(data, args.objective, chosen))
    print(f"wrote {out_json}")
    stem = "tune" if args.step_time == "measure" else \
        "tune_" + os.path.splitext(os.path.basename(args.step_time))[0]  # one plot per time source
    png = save_plot(data, os.path.join(args.out, stem + ".png"), chosen)
    if png:
        print(f"wrote {png}")
    if chosen is not None:
        p = data["configs"][chosen]
        path = args.write_preset or os.path.join(args.out, "preset.json")
        model_name = os.path.basename(str(args.model or "toy").rstrip("/"))
        name = args.preset_name or f"tuned-{model_name}-{p['policy']}"
        opts = {k: v for k, v in p["options"].items() if k != "gen_length"}
        presets.write(path, name, opts, description=f"chosen by blockbatch tune: {chosen}",
                      evidence={"config": chosen, "objective": args.objective, "max_drop": args.max_drop,
                                "accuracy": p["accuracy"], "mean_nfe": p["mean_nfe"],
                                "mean_model_ms": p["mean_model_ms"], "setup": data["setup"],
                                "frontier": frontier(data["configs"], key)})
        print(f"wrote {path} (preset {name!r}: {chosen})")
    if data["stopped"]:
        left = len(data["remaining"])
        print(f"{data['stopped']}: {len(data['configs'])} configs done, {left} left; rerun the same command to "
              f"continue", file=sys.stderr)
        return 130 if data["stopped"] == "interrupted" else 0
    return 0
