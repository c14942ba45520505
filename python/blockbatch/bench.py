"""``blockbatch bench``: a task set under several policies, side by side, on one checkpoint.

Policies are interleaved per sample so that machine drift hits all of them alike. Per policy:
accuracy, mean / median NFE, tokens per forward, median wall time per sample, generated tokens
per second (prompt tokens excluded), peak memory; optionally the same policies through the
pure-PyTorch reference loops (``compare_reference``) and the per-policy speed ratio.

Task sets: the toy task's held-out problems (default) or a JSONL file whose lines hold
``{"prompt": str, "answer": str}`` or ``{"ids": [...], "answer": ...}`` (exact match of the
stripped generation; ``blockbatch.tasks``).
"""

from __future__ import annotations

import functools
import os
import resource
import statistics
import sys
import time

import torch

from . import contract
from . import families
from . import policies as policy_registry
from . import tasks
from .options import DecodeOptions
from .tasks import Sample

# The default family's (LLaDA's) bench policies: the paper's three (docs/ALGORITHMS.md 3).
DEFAULT_POLICIES = families.get(contract.FAMILIES[0]).BENCH_POLICIES


# The options a policy spec may set (policy and gen_length are set by the spec's name and the
# bench's --gen-length): every other option of the table, parsed by the table's types.
SPEC_OPTIONS = tuple(n for n in contract.NAMES if n not in ("policy", "gen_length"))


POLICY_BASES = tuple(policy_registry.REGISTRY)  # a bare policy name: its module's bench_options


def policy_kwargs(name: str, gen_length: int, fit: bool = True) -> dict:
    """The DecodeOptions fields of a policy spec (see ``policy_options``), not yet validated.
    A preset's block sizes are fitted to ``gen_length`` (``presets.values``) unless ``fit`` is
    False (then they are the preset's: lm-eval rounds the canvas up to them first)."""
    from . import presets

    base, _, spec = name.partition(":")
    preset = None
    if base not in policy_registry.REGISTRY:
        if not (base in presets.BUILT_IN or os.path.exists(base) or base.endswith(".json") or os.sep in base):
            raise ValueError(
                f"policy must be one of {', '.join(policy_registry.REGISTRY)}, a preset ({', '.join(presets.names())}) "
                f"or a preset file's path, optionally name:key=value,..., got {name!r}"
            )
        try:
            preset = presets.get(base)
        except ValueError as e:  # a preset file that cannot be read
            raise ValueError(f"{name!r}: {e}") from None
    overrides = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key not in SPEC_OPTIONS:
            raise ValueError(f"{name!r}: unknown option {key!r}; known: {', '.join(sorted(SPEC_OPTIONS))}")
        try:
            overrides[key] = contract.parse_text(key, value, list_sep="/")  # lists: 8/32 (commas separate options)
        except ValueError:
            raise ValueError(f"{name!r}: option {key}={value!r} is not a valid value for {key}") from None
    if preset is None:
        return {**policy_registry.get(base).bench_options(gen_length), "gen_length": gen_length, **overrides}
    if not fit:
        return {
            **{k: tuple(v) if isinstance(v, list) else v for k, v in preset.options.items()},
            **overrides,
            "gen_length": gen_length,
        }
    try:
        return presets.values(preset, overrides, gen_length)
    except ValueError as e:  # none of the preset's block sizes divides gen_length
        raise ValueError(f"{name!r}: {e}") from None


def policy_options(name: str, gen_length: int) -> DecodeOptions:
    """A policy (``vanilla`` | ``prefix`` | ``dual`` | ``blockbatch`` | ``block``: ``blockbatch.policies``, each
    with its module's ``bench_options``) | a preset (``blockbatch-paper``, ...:
    ``blockbatch.presets``) | a preset file's path, optionally ``name:key=value,...`` (e.g.
    ``blockbatch:block_sizes=8/32,sync_gap=4``, ``dual:block_length=16,threshold=0.7`` or
    ``blockbatch-paper:threshold=0.8``: the pairs win over the preset's options)."""
    return DecodeOptions(**policy_kwargs(name, gen_length))


def load_tasks(path: str | None, n: int, answers_optional: bool = False) -> list[Sample]:
    """The first ``n`` samples (n >= 1) of the toy task (``path`` None) or of a JSONL task file
    (``blockbatch.tasks``: "prompt" or "ids", "answer" compared exactly). Errors name the file
    and line. ``answers_optional``: a line may leave out "answer" (its Sample's ``check`` is None)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if path is None:
        return tasks.load_toy(n).samples
    return tasks.load_jsonl(path, n, answers_optional=answers_optional).samples


def environment() -> dict:
    """Versions, threads and device: recorded with every benchmark result."""
    import platform

    from . import __version__

    return {
        "blockbatch": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_bench(
    engine,
    samples: list[Sample],
    policies: dict[str, DecodeOptions],
    compare_reference: bool = False,
    progress: bool = True,
) -> dict:
    """Per-sample records and per-policy summaries (see the module docstring)."""
    if not samples:
        raise ValueError("samples is empty: the bench needs at least one task")
    if not policies:
        raise ValueError("policies is empty: the bench needs at least one policy")
    records = []
    ref_model = None
    if compare_reference:
        ref_model = reference_model(engine.checkpoint)
    t0 = time.perf_counter()
    for i, sample in enumerate(samples):
        ids = tasks.encode(engine, sample)
        for name, options in policies.items():
            start = time.perf_counter()
            [gen] = engine.generate(ids, options)
            wall_ms = (time.perf_counter() - start) * 1e3
            assert sample.check is not None  # scored samples: load_tasks without answers_optional
            rec = {
                "sample": i,
                "policy": name,
                "output": gen.text,
                "correct": bool(sample.check(gen)),
                "nfe": gen.stats["nfe"],
                "nfe_paper": gen.stats["nfe_paper"],
                "wall_ms": wall_ms,
                "generated_tokens": len(gen.ids),
                "committed": sum(gen.stats["committed_per_step"]),
            }
            if ref_model is not None:
                start = time.perf_counter()
                ref_tokens = reference_decode(
                    ref_model, ids, options, engine.checkpoint.proposal_vocab, engine.checkpoint.config.family
                )
                rec["reference_wall_ms"] = (time.perf_counter() - start) * 1e3
                rec["reference_equal"] = bool(torch.equal(ref_tokens, torch.tensor(ids.tolist() + gen.raw_ids)))
            records.append(rec)
        if progress:
            el = time.perf_counter() - t0
            sys.stderr.write(
                f"\r[{i + 1}/{len(samples)}] {el:.0f}s elapsed, ETA {el / (i + 1) * (len(samples) - i - 1):.0f}s"
            )
    if progress:
        sys.stderr.write("\n")
    summary = {}
    for name in policies:
        rows = [r for r in records if r["policy"] == name]
        total_ms = sum(r["wall_ms"] for r in rows)
        s = {
            "accuracy": sum(r["correct"] for r in rows) / len(rows),
            "mean_nfe": statistics.mean(r["nfe"] for r in rows),
            "median_nfe": statistics.median(r["nfe"] for r in rows),
            "mean_nfe_paper": statistics.mean(r["nfe_paper"] for r in rows),
            "tokens_per_forward": sum(r["committed"] for r in rows) / sum(r["nfe"] for r in rows),
            "median_wall_ms": statistics.median(r["wall_ms"] for r in rows),
            "mean_wall_ms": total_ms / len(rows),
            "generated_tokens_per_s": 1e3 * sum(r["generated_tokens"] for r in rows) / total_ms,
        }
        if compare_reference:
            s["reference_median_wall_ms"] = statistics.median(r["reference_wall_ms"] for r in rows)
            s["speedup_vs_reference"] = s["reference_median_wall_ms"] / s["median_wall_ms"]
            s["reference_token_equal"] = sum(r["reference_equal"] for r in rows) / len(rows)
        summary[name] = s
    if policy_registry.BASELINE in summary:  # the columns keep their names: the baseline is dual cache
        base = summary[policy_registry.BASELINE]
        for s in summary.values():
            s["nfe_vs_dual"] = s["mean_nfe"] / base["mean_nfe"]
            s["speedup_vs_dual"] = base["median_wall_ms"] / s["median_wall_ms"]
    return {"summary": summary, "records": records, "peak_rss_mb": peak_rss_mb()}


def reference_model(checkpoint):
    """The pure-PyTorch reference model of a checkpoint's family: its module's ``reference_model`` where
    it has one (LLaDA2's own forward), else ``reference.model.ReferenceModel`` (LLaDA, Dream)."""
    own = getattr(families.of(checkpoint.config), "reference_model", None)
    if own is not None:
        return own(checkpoint)
    from .reference.model import ReferenceModel

    return ReferenceModel.from_checkpoint(checkpoint)


def reference_decode(
    ref_model, ids: torch.Tensor, o: DecodeOptions, proposal_vocab: int | None = None, family: str | None = None
) -> torch.Tensor:
    """The same request through the pure-PyTorch reference loop (what the authors' code does): the
    policy's reference entry for the model's family (``blockbatch.policies.reference``), the full canvas row (a
    BlockBatch row cut at its EOS continues with EOS). ``family``: the checkpoint's (None: the
    reference model's config says)."""
    if family is None:
        family = ref_model.config.family
    row, _ = policy_registry.reference(ref_model, ids, o, family, proposal_vocab)
    return row


def format_table(result: dict) -> str:
    width = max([11, *map(len, result["summary"])])  # the policy specs as given (presets can be long)
    cols = [
        ("policy", f"{{:{width}s}}"),
        ("acc", "{:6.3f}"),
        ("NFE", "{:7.2f}"),
        ("NFE med", "{:7.1f}"),
        ("tok/fwd", "{:7.2f}"),
        ("ms med", "{:8.2f}"),
        ("gen tok/s", "{:9.1f}"),
    ]
    keys = ["accuracy", "mean_nfe", "median_nfe", "tokens_per_forward", "median_wall_ms", "generated_tokens_per_s"]
    any_s = next(iter(result["summary"].values()))
    if "nfe_vs_dual" in any_s:
        cols += [("NFE/dual", "{:8.3f}"), ("x dual", "{:6.2f}")]
        keys += ["nfe_vs_dual", "speedup_vs_dual"]
    if "speedup_vs_reference" in any_s:
        cols += [("ref ms", "{:8.1f}"), ("x ref", "{:6.2f}"), ("ref==", "{:5.2f}")]
        keys += ["reference_median_wall_ms", "speedup_vs_reference", "reference_token_equal"]
    head = " ".join(
        f"{name:>{len(fmt.format(0) if 'f' in fmt else name)}}" if i else f"{name:{width}s}"
        for i, (name, fmt) in enumerate(cols)
    )
    lines = [head]
    for policy, s in result["summary"].items():
        lines.append(" ".join([cols[0][1].format(policy)] + [fmt.format(s[k]) for (_, fmt), k in zip(cols[1:], keys)]))
    lines.append(f"peak RSS {result['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note on stderr) when matplotlib is
    not installed: plots are optional, the JSON is what a run must write."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG plots (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


PLOTS = ("accuracy_vs_nfe.png", "speedup_vs_dual.png")  # what save_plots may write in its folder


def save_plots(result: dict, out_dir: str, flag: str = "--out") -> list[str]:
    """accuracy vs NFE per policy, and speedup bars against dual cache (needs matplotlib); each
    written atomically (blockbatch.outputs), errors naming ``flag`` and the file."""
    from .outputs import write_atomic

    plt = pyplot()
    if plt is None:
        return []
    summary = result["summary"]
    paths = []
    fig, ax = plt.subplots(figsize=(5, 4))
    for name, s in summary.items():
        ax.scatter(s["mean_nfe"], s["accuracy"], s=60)
        ax.annotate(name, (s["mean_nfe"], s["accuracy"]), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("mean NFE per sample")
    ax.set_ylabel("accuracy")
    ax.set_title("accuracy vs forward passes")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, PLOTS[0]))
    write_atomic(paths[-1], functools.partial(_save_png, fig), flag)
    if "speedup_vs_dual" in next(iter(summary.values())):
        fig, ax = plt.subplots(figsize=(5, 4))
        names = list(summary)
        ax.bar(names, [summary[n]["speedup_vs_dual"] for n in names])
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_ylabel("speedup vs dual cache (median time per sample)")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, PLOTS[1]))
        write_atomic(paths[-1], functools.partial(_save_png, fig), flag)
    plt.close("all")
    return paths


def _save_png(fig, buf) -> None:
    fig.savefig(buf, dpi=120, format="png")
