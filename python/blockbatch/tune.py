"""``blockbatch tune``: sweep decode settings on a task set, draw the accuracy-NFE-time frontier,
write the chosen setting as a preset.

Every setting ("config") is a policy spec as ``blockbatch bench`` takes it
(``dual:block_length=64,threshold=0.8``, ``blockbatch:block_sizes=16/32/64,merge_gate=0.9``).
Each is decoded on every task; per config: accuracy, mean NFE, mean query tokens per sample,
measured wall time per sample and the time a step-time model gives (``blockbatch.steptime``:
measured on this machine, or loaded with ``--step-time FILE``, e.g. the H200 step benchmark,
so a CPU sweep can be read in GPU time).

Accuracy: the mean score of a task set's check (``blockbatch.tasks``): the toy task's answer
check; a task file's answers by exact match, by the last number (``--answer last-number``) or by
a regular expression's capture (``--answer-regex``); an lm-evaluation-harness task's filters and
metric (``--lm-eval-task``). A task file without answers is scored by agreement with a slow
reference decode (vanilla, one token per step), decoded once and kept in the JSON.

Dev and test: with ``--dev N --test M`` the choice is made on the first N tasks and every config
is also scored on the next M, which chose nothing; the JSON (a config's ``test``), the printed
table and the plot show both, so a setting that only fits the tasks it was chosen on shows.

The sweep writes ``tune.json`` after every config (atomically): a rerun with the same model,
tasks, n and gen_length skips what is done (``--fresh`` starts over), Ctrl-C and
``--time-budget`` stop between configs and lose nothing. The frontier: configs that no other
config beats on both accuracy (higher) and cost (lower mean NFE, or time with
``--objective time``). The choice: among configs within ``--max-drop`` of the best accuracy
(of every config swept), the cheapest (``--pick-policy`` restricts the candidates).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
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
    block_lengths: tuple[int, ...] = (16, 32, 64)  # dual / prefix / block
    thresholds: tuple[float, ...] = (0.95, 0.9, 0.8, 0.7)
    branch_sets: tuple[tuple[int, ...], ...] = (
        (4, 8, 16, 32, 64, 128),
        (8, 16, 32, 64),
        (16, 32, 64, 128),
        (32, 64, 128),
    )
    merge_gates: tuple[float, ...] = (0.5, 0.9)
    eos_exit: tuple[bool, ...] = (True,)
    refresh: tuple[str, ...] = ("32",)  # refresh_tokens; "block": the smallest branch (every branch refreshes
    #                                     at each of its own block boundaries)
    sync_refresh: tuple[bool, ...] = (False, True)  # the variant of ALGORITHMS.md 10.3
    refresh_intervals: tuple[int, ...] = (8, 16, 32)  # window: steps per phase
    active_tokens: tuple[int, ...] = (8, 16)  # window: masks a pruned step computes
    window_tokens: tuple[int, ...] = (32, 64)  # window: masks kept as keys
    unmasking: tuple[str, ...] = ()  # block on SDAR: its commit rules (a family's TUNE_GRID sets them)
    max_active_blocks: tuple[int, ...] = (1, 2, 3, 4)  # wavefront: blocks in flight at most
    spawn_thresholds: tuple[float, ...] = (0.25, 0.5, 0.75)  # wavefront: the readiness gate


GRIDS = {
    "small": Grid(
        thresholds=(0.9, 0.8, 0.7),
        branch_sets=((4, 8, 16, 32, 64, 128), (16, 32, 64, 128), (32, 64, 128)),
        sync_refresh=(True,),
    ),
    "default": Grid(),
    "full": Grid(
        policies=("prefix", "dual", "blockbatch"),
        thresholds=(0.95, 0.9, 0.85, 0.8, 0.7, 0.6),
        merge_gates=(0.5, 0.7, 0.9),
        eos_exit=(True, False),
        refresh=("16", "32", "64", "block"),
    ),
}


def configs(grid: Grid, gen_length: int) -> list[str]:
    """The policy specs of a grid, for one gen_length (block sizes that do not divide it are left
    out, duplicate branch sets once). Ordered coarse to fine, policies interleaved, so a sweep
    cut short by its time budget has still covered every policy around the paper's settings.
    Each policy's rows and ranks are its module's (``blockbatch.policies``: ``tune_rows``)."""
    from . import policies

    per_policy: dict[str, list[str]] = {}
    for policy in grid.policies:
        module = policies.REGISTRY.get(policy)
        if module is None:
            raise ValueError(f"policies: {policy!r} is not one of {', '.join(policies.REGISTRY)}")
        rows = module.tune_rows(grid, gen_length)
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
        if not any(
            q["accuracy"] >= p["accuracy"]
            and q[cost] <= p[cost]
            and (q["accuracy"] > p["accuracy"] or q[cost] < p[cost])
            for m, q in points.items()
            if m != n
        ):
            names.append(n)
    return sorted(names, key=lambda n: (points[n][cost], -points[n]["accuracy"]))


def choose(points: dict[str, dict], cost: str, max_drop: float, policy: str | None = None) -> str | None:
    """Among configs (of ``policy`` when given) within ``max_drop`` of the best accuracy of all
    configs, the cheapest; ties: the more accurate, then the fewer query tokens (the same NFE on
    fewer branch rows costs less compute), then the name."""
    if not points:
        return None
    best = max(p["accuracy"] for p in points.values())
    cands = [
        n
        for n, p in points.items()
        if p["accuracy"] >= best - max_drop - 1e-12 and (policy is None or n.partition(":")[0] == policy)
    ]
    if not cands and policy is not None:  # none of that policy close enough: its most accurate, cheapest
        own = {n: p for n, p in points.items() if n.partition(":")[0] == policy}
        if not own:
            return None
        top = max(p["accuracy"] for p in own.values())
        cands = [n for n, p in own.items() if p["accuracy"] == top]
    return min(cands, key=lambda n: (points[n][cost], -points[n]["accuracy"], points[n].get("mean_query_tokens", 0), n))


# --------------------------------------------------------------------------- the sweep


def setup_key(
    model: str,
    tasks: str,
    samples: list,
    n: int,
    gen_length: int,
    dev: int | None = None,
    tasks_sha256: str | None = None,
    scored_by: str | None = None,
) -> dict:
    """What a sweep was measured on; a rerun resumes only a sweep of the same setup. ``dev``: the
    first ``dev`` of the ``n`` samples choose, the rest (``test``) only report (None: all choose)."""
    h = hashlib.sha256(json.dumps([s.prompt for s in samples]).encode()).hexdigest()[:16]
    out = {"model": model, "tasks": tasks, "n": n, "gen_length": gen_length, "prompts_sha256": h}
    encodings = sorted({getattr(s, "encoding", "chat") for s in samples} - {"chat"})
    if encodings:
        out["encoding"] = "/".join(encodings)  # text not through the checkpoint's chat template
    if dev is not None and dev < n:
        out.update(dev=dev, test=n - dev)
    if tasks_sha256 is not None:
        out["tasks_sha256"] = tasks_sha256
    if scored_by is not None:
        out["check"] = scored_by
    return out


def split(setup: dict) -> int:
    """How many of a sweep's samples are its dev set (the rest: its test set)."""
    return int(setup.get("dev", setup["n"]))


def _write_json(path: str, data: dict) -> None:
    from .errors import write_json_file

    write_json_file(path, data, indent=None, flag="--out")  # compact: it holds every task's step log


def summarize(records: list[dict]) -> dict:
    """Accuracy (mean score: 1/0 for an answer check, the metric for an lm-eval task), NFE, query
    tokens and wall time over ``records``."""
    return {
        "n": len(records),
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


def run_tune(
    engine,
    samples: list,
    specs: Sequence[str],
    gen_length: int,
    out_path: str,
    setup: dict,
    step_model,
    time_budget_s: float | None = None,
    progress: bool = True,
    fresh: bool = False,
    max_batch: int = 1,
) -> dict:
    """Decode every sample with every config, saving ``out_path`` after each config; returns the
    JSON's contents. A config already in an existing ``out_path`` with the same setup is skipped. A
    config whose decodes are refused (a setting the policy cannot run on these prompts, such as a
    window span past its kept prefix) is reported on stderr and kept under ``refused`` with the
    reason, out of the frontier."""
    from . import bench, tasks
    from .errors import RequestError

    data = None
    if os.path.exists(out_path) and not fresh:
        try:
            with open(out_path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{out_path}: cannot resume from it ({e}); pass --fresh to start over") from None
        if data.get("tune") != FORMAT or data.get("setup") != setup:
            raise ValueError(
                f"{out_path}: holds a sweep of another setup ({json.dumps(data.get('setup'))}); pass "
                f"--fresh to overwrite it or choose another --out"
            )
    if data is None:
        data = {"tune": FORMAT, "setup": setup, "environment": bench.environment(), "reference": None, "configs": {}}
    data["step_time"] = step_model.to_dict()
    options = {spec: bench.policy_options(spec, gen_length) for spec in specs}  # bad spec: error before decoding
    encoded = [tasks.encode(engine, s) for s in samples]
    scored_by = "answers" if all(s.check is not None for s in samples) else "reference"
    data["scored_by"] = scored_by
    refused = data.setdefault("refused", {})  # spec -> why its decodes were refused (e.g. window's spans)
    todo = [s for s in specs if s not in data["configs"] and s not in refused]
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
            try:
                gens, walls = _decode_config(engine, encoded, o, max_batch, bar, spec)
            except RequestError as e:  # a setting the policy cannot run on these prompts: skipped, said why
                refused[spec] = str(e)
                print(f"tune: {spec}: refused ({e.param}): {e}", file=sys.stderr)
                _write_json(out_path, data)
                continue
            for i, (g, wall) in enumerate(zip(gens, walls)):
                if scored_by == "answers":
                    score = float(samples[i].check(g))
                    correct: bool | float = bool(score) if score in (0.0, 1.0) else score
                else:
                    correct = g.ids == data["reference"]["ids"][i]
                L = encoded[i].numel() + gen_length
                q = g.stats["query_tokens_per_step"]
                records.append(
                    {
                        "correct": correct,
                        "nfe": g.stats["nfe"],
                        "query_tokens": sum(q),
                        "wall_ms": wall,
                        "steps": q,
                        "length": L,
                    }
                )
            dev = split(setup)
            data["configs"][spec] = {
                "policy": o.policy,
                "options": _options_dict(o),
                **summarize(records[:dev]),
                **({"test": summarize(records[dev:])} if dev < len(records) else {}),
                "correct": [r["correct"] for r in records],
                "nfe": [r["nfe"] for r in records],
                "query_tokens_per_step": [r["steps"] for r in records],
                "lengths": [r["length"] for r in records],
            }
            _model_config(data["configs"][spec], step_model, dev)
            _write_json(out_path, data)
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        bar.close()
    data["stopped"] = stopped
    data["remaining"] = [s for s in specs if s not in data["configs"] and s not in refused]
    remodel(data, step_model)
    _write_json(out_path, data)
    return data


def _decode_config(engine, encoded, o, max_batch: int, bar, spec: str):
    """One config's decodes of every prompt: (generations, wall ms per sample)."""
    if max_batch > 1:
        start = time.perf_counter()
        gens = engine.generate(encoded, o, max_batch=max_batch)
        per = (time.perf_counter() - start) * 1e3 / len(encoded)
        bar.update(len(encoded), spec)
        return gens, [per] * len(encoded)
    gens, walls = [], []
    for ids in encoded:
        start = time.perf_counter()
        [g] = engine.generate(ids, o)
        walls.append((time.perf_counter() - start) * 1e3)
        gens.append(g)
        bar.update(1, spec)
    return gens, walls


def remodel(data: dict, step_model) -> None:
    """Every config's modelled time under ``step_model`` (from the step logs kept per sample), so a
    sweep resumed or re-read with another ``--step-time`` is in one time throughout."""
    data["step_time"] = step_model.to_dict()
    for rec in data["configs"].values():
        _model_config(rec, step_model, split(data["setup"]))


def _model_config(rec: dict, step_model, dev: int | None = None) -> None:
    """A config's mean modelled ms per task (dev and test apart), from its tasks' step logs."""
    ms = [step_model.decode_seconds(q, L) * 1e3 for q, L in zip(rec["query_tokens_per_step"], rec["lengths"])]
    dev = len(ms) if dev is None else dev
    rec["mean_model_ms"] = statistics.mean(ms[:dev])
    if "test" in rec:
        rec["test"]["mean_model_ms"] = statistics.mean(ms[dev:])


def _options_dict(o) -> dict:
    from . import contract

    return {
        n: (list(v) if isinstance(v, tuple) else v)
        for n in contract.NAMES
        for v in [getattr(o, n)]
        if v != contract.DEFAULTS[n] or n in ("policy", "gen_length")
    }


# --------------------------------------------------------------------------- report


def cost_key(objective: str) -> str:
    return {"nfe": "mean_nfe", "time": "mean_model_ms"}[objective]
