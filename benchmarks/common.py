"""Shared benchmark helpers: environment record, interleaved timing, JSON output, the opt-in CUDA kernels."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from typing import Callable

from blockbatch import settings
from blockbatch.bench import environment  # noqa: F401  (re-exported for the benchmark scripts)


# The opt-in kernels the GPU benchmarks time against the defaults, in timing order (least risky
# first), then "all" of them together: derived from the settings table (blockbatch/settings.py).
# bench_gpu_step.py times each; gpu_decode_check.py decodes with them.
CANDIDATES = settings.candidates()


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, dict]:
    """Time each callable `repeats` times, round-robin so machine drift hits all alike.

    Returns {name: {"median_s", "min_s", "runs_s"}}.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    return {name: {"median_s": statistics.median(r), "min_s": min(r), "runs_s": r} for name, r in runs.items()}


@contextlib.contextmanager
def environ(**values):
    """Environment variables set for the block (None: unset), restored after it."""
    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def write_json(path: str, payload: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
    print(f"wrote {path}")


def write_png(json_path: str, draw, size: tuple[float, float] = (5.5, 4)) -> None:
    """The PNG beside ``json_path`` (same name, .png): ``draw(ax)`` on one figure. Without
    matplotlib a note says there is none."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no PNG", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    fig.tight_layout()
    png = os.path.splitext(json_path)[0] + ".png"
    fig.savefig(png, dpi=120)
    print(f"wrote {png}")
