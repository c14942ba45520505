"""Shared benchmark helpers: environment record, interleaved timing, JSON output, the opt-in CUDA kernels."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from typing import Callable

from blockbatch.bench import environment  # noqa: F401  (re-exported for the benchmark scripts)


# Opt-in kernels not yet made the default (each needs a GPU run to check and time it first), in the
# order they are timed: least risky first, since a kernel that faults ends its process's CUDA
# context and with it the timings of every candidate after it (each is timed on every step before
# the next one starts). bench_gpu_step.py times each; gpu_decode_check.py decodes with them.
CANDIDATES = {
    "pdl": {"BLOCKBATCH_PDL": "1"},             # programmatic dependent launch (launch.cuh)
    "rope_vec": {"BLOCKBATCH_ROPE_KERNEL": "vec"},  # 16-byte rope_kv_write
    "pad": {"BLOCKBATCH_GEMM_PAD": "64"},       # cuBLAS GEMMs of > 64 rows on rows padded to 64 (252 -> 256)
    "attn3": {"BLOCKBATCH_ATTN_KERNEL": "pipelined3"},  # attention with 3 cp.async K/V stages
    "attn_split": {"BLOCKBATCH_ATTN_KERNEL": "splitwarps"},  # + small q-tiles' keys split over warps
    "stream": {"BLOCKBATCH_GEMM": "stream"},    # weight-streaming GEMM for <= 64 rows (linear.cu)
    "staged": {"BLOCKBATCH_GEMM": "staged"},    # the same through a cp.async shared-memory ring
    "all": {"BLOCKBATCH_GEMM": "stream", "BLOCKBATCH_GEMM_PAD": "64", "BLOCKBATCH_ROPE_KERNEL": "vec", "BLOCKBATCH_PDL": "1",
            "BLOCKBATCH_ATTN_KERNEL": "splitwarps"},
}


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
