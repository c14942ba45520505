"""``blockbatch tune``'s report: the frontier table (dev and test scores side by side) and the plot
(accuracy vs mean NFE and vs modelled time; the dev frontier's configs on the test tasks)."""

from __future__ import annotations

import os

from . import policies
from .outputs import write_atomic
from .tune import cost_key, frontier, split


def format_report(data: dict, objective: str, chosen: str | None, limit: int = 40) -> str:
    """The frontier on the dev tasks (the choice's), with each config's test scores beside it when
    the sweep has a test split: a choice that does not hold on unseen tasks shows here."""
    pts = data["configs"]
    key = cost_key(objective)
    front = frontier(pts, key)
    setup = data["setup"]
    test = int(setup.get("test", 0))
    check = setup.get("check", data["scored_by"])
    sets = f"{split(setup)} dev + {test} test tasks" if test else f"{setup['n']} tasks"
    lines = [
        f"{len(pts)} configs on {sets} (accuracy by {check}); frontier on the dev tasks by "
        f"{'mean NFE' if objective == 'nfe' else 'modelled time'} ({len(front)} configs):",
        f"  {'acc':>6} {'NFE':>6} {'q tok':>7} {'wall ms':>8} {'model ms':>9}"
        + (f" | {'test acc':>8} {'NFE':>6} {'model ms':>9}" if test else "")
        + "  config",
    ]

    def row(p: dict) -> str:
        out = (
            f"{p['accuracy']:6.3f} {p['mean_nfe']:6.2f} {p['mean_query_tokens']:7.0f} "
            f"{p['mean_wall_ms']:8.2f} {p['mean_model_ms']:9.2f}"
        )
        if test:
            t = p["test"]
            out += f" | {t['accuracy']:8.3f} {t['mean_nfe']:6.2f} {t['mean_model_ms']:9.2f}"
        return out

    for n in front[:limit]:
        lines.append(f"  {row(pts[n])}  {n}{'  <- chosen' if n == chosen else ''}")
    if chosen is not None and chosen not in front:
        lines.append(f"  {row(pts[chosen])}  {chosen}  <- chosen (off this frontier)")
    if chosen is not None and test:
        p, t = pts[chosen], pts[chosen]["test"]
        lines.append(
            f"chosen on dev: {p['accuracy']:.3f} accuracy at {p['mean_nfe']:.2f} NFE; on the {test} test tasks: "
            f"{t['accuracy']:.3f} at {t['mean_nfe']:.2f} NFE"
        )
    lines.append(f"model time: {data['step_time']['source']}")
    return "\n".join(lines)


def save_plot(data: dict, path: str, chosen: str | None, flag: str = "file") -> str | None:
    """Accuracy vs mean NFE and vs modelled time per sample, one colour per policy, frontiers drawn;
    written atomically (blockbatch.outputs), errors naming ``flag`` and ``path``."""
    from .bench import pyplot

    plt = pyplot()
    if plt is None:
        return None
    pts = data["configs"]
    colors = {name: module.PLOT_COLOR for name, module in policies.REGISTRY.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    for ax, key, label in (
        (axes[0], "mean_nfe", "mean NFE per sample"),
        (axes[1], "mean_model_ms", f"modelled ms per sample\n({data['step_time']['source']})"),
    ):
        for policy in colors:
            sel = [p for n, p in pts.items() if p["policy"] == policy]
            if sel:
                ax.scatter(
                    [p[key] for p in sel], [p["accuracy"] for p in sel], s=22, alpha=0.7, c=colors[policy], label=policy
                )
        for policy in ("dual", "blockbatch", "block", "window", "wavefront"):
            own = {n: p for n, p in pts.items() if p["policy"] == policy}
            f = frontier(own, key)
            if len(f) > 1:
                ax.step(
                    [own[n][key] for n in f],
                    [own[n]["accuracy"] for n in f],
                    where="post",
                    c=colors[policy],
                    lw=1,
                    alpha=0.6,
                )
        f = frontier(pts, key)
        ax.step(
            [pts[n][key] for n in f],
            [pts[n]["accuracy"] for n in f],
            where="post",
            c="k",
            lw=1.5,
            label="frontier (all)",
        )
        test = [n for n in f if "test" in pts[n]]
        if test:  # the dev frontier's configs on the test tasks: hollow, joined to their dev point
            for n in test:
                ax.plot(
                    [pts[n][key], pts[n]["test"][key]],
                    [pts[n]["accuracy"], pts[n]["test"]["accuracy"]],
                    c="0.5",
                    lw=0.6,
                    alpha=0.7,
                )
            ax.scatter(
                [pts[n]["test"][key] for n in test],
                [pts[n]["test"]["accuracy"] for n in test],
                s=30,
                facecolors="none",
                edgecolors="k",
                label="dev frontier on test tasks",
            )
        if chosen in pts:
            ax.scatter(
                [pts[chosen][key]],
                [pts[chosen]["accuracy"]],
                marker="*",
                s=220,
                c="gold",
                edgecolors="k",
                zorder=5,
                label="chosen",
            )
        ax.set_xlabel(label, fontsize=8 if key == "mean_model_ms" else 10)
        ax.set_ylabel("accuracy" if data["scored_by"] == "answers" else "agreement with one-token-per-step decode")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    setup = data["setup"]
    sets = f"{split(setup)} dev + {setup['test']} test tasks" if setup.get("test") else f"{setup['n']} tasks"
    fig.suptitle(
        f"{os.path.basename(str(setup['model']).rstrip('/')) or setup['model']}: {sets}, "
        f"gen_length {setup['gen_length']}",
        fontsize=10,
    )
    fig.tight_layout()
    try:
        write_atomic(path, lambda buf: fig.savefig(buf, dpi=110, format="png"), flag)
    finally:
        plt.close(fig)
    return path
