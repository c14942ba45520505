"""A step-time model: seconds of one packed forward as a function of its query tokens and length.

    t(q, L) = a + b q + c L + d q L        (q: packed query tokens, L: the sequence it attends to)

``a`` is the fixed cost of a step (launches, weights streamed once on a GPU), ``b`` the per-token
cost of the dense layers, ``c`` reading the KV cache (per row, on a GPU), ``d`` attention.
A decode's time under the model is the sum over its steps of t(q_step, prompt + gen_length), its
steps' query tokens read from the decode's step log (``stats["query_tokens_per_step"]``): a full
forward has q = L, a cached block step q = the window(s), a BlockBatch step the packed windows of
every branch. Host-side bookkeeping is not in the model.

Where the coefficients come from:

- ``measure(model)``: timed on the machine at hand, on the model being tuned (cached steps of
  q = 8..512 query tokens over L = 128 and 512, and full forwards), fitted by least squares;
- ``load(path)``: a JSON this module wrote (``save``), or the GPU step benchmark's JSON
  (``benchmarks/bench_gpu_step.py``: LLaDA-8B shape on an H200, ``docs/bench/gpu/bench_gpu_step.json``),
  so that a frontier swept on a CPU can be drawn in the GPU's time. ``source`` says which.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Callable, Iterable, Sequence

FORMAT = 1
NAMES = ("a", "b", "c", "d")


@dataclasses.dataclass(frozen=True)
class StepTimeModel:
    coef: tuple[float, float, float, float]  # seconds: a, b (per q), c (per L), d (per q * L)
    source: str  # where the coefficients come from, for plots and JSON
    points: tuple[tuple[int, int, float], ...] = ()  # (q, L, seconds) it was fitted to

    def step_seconds(self, q: int, L: int) -> float:
        a, b, c, d = self.coef
        return a + b * q + c * L + d * q * L

    def decode_seconds(self, query_tokens_per_step: Sequence[int], length: int) -> float:
        """Modelled seconds of a decode whose steps packed these query tokens, over a canvas of
        ``length`` (prompt + gen_length) positions."""
        return sum(self.step_seconds(q, length) for q in query_tokens_per_step)

    def to_dict(self) -> dict:
        return {
            "step_time_model": FORMAT,
            "formula": "t = a + b*q + c*L + d*q*L (seconds)",
            "coef": dict(zip(NAMES, self.coef)),
            "source": self.source,
            "points": [{"query_tokens": q, "L": L, "seconds": s} for q, L, s in self.points],
        }

    def save(self, path: str) -> None:
        from .errors import write_json_file

        write_json_file(path, self.to_dict())


def fit(points: Iterable[tuple[int, int, float]], source: str) -> StepTimeModel:
    """Least-squares coefficients (relative error: every point weighs alike), none negative: a
    coefficient the data would make negative is dropped and the rest refitted."""
    import numpy as np

    pts = [(int(q), int(L), float(s)) for q, L, s in points]
    if len(pts) < 2:
        raise ValueError(f"a step-time model needs at least 2 measured points, got {len(pts)}")
    X = np.array([[1.0, q, L, q * L] for q, L, _ in pts])
    y = np.array([s for _, _, s in pts])
    w = 1.0 / y
    active = [0, 1, 2, 3]
    while True:
        sol, *_ = np.linalg.lstsq(X[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all() or len(active) == 1:
            break
        active.pop(int(np.argmin(sol)))
    coef = [0.0] * 4
    for i, v in zip(active, sol):
        coef[i] = max(float(v), 0.0)
    return StepTimeModel((coef[0], coef[1], coef[2], coef[3]), source, tuple(pts))


def measure(
    model,
    tokens: Sequence[int] = (8, 32, 128, 512),
    lengths: Sequence[int] = (128, 512),
    repeats: int = 5,
    source: str | None = None,
) -> StepTimeModel:
    """Time packed forwards of ``model`` (a ``NativeModel``) on this machine and fit the model:
    cached steps of q query tokens (windows of at most 128, each its own KV row) over L, and
    full forwards (q = L). Median of ``repeats`` interleaved runs per shape (a second or two on
    a small model)."""
    import torch

    from .native import pack_rows

    c = model.config
    lengths = [L for L in lengths if L <= c.max_sequence_length] or [min(128, c.max_sequence_length)]
    shapes: dict[tuple[int, int], Callable[..., object]] = {}
    for L in lengths:
        for q in list(tokens) + [L]:
            if q > L and q != L:
                continue
            windows = [min(128, L)] * (q // min(128, L)) + ([q % min(128, L)] if q % min(128, L) else [])
            if q == L:  # a full forward: the whole row, no cache
                ids, pos = [torch.full((L,), c.mask_token_id)], [torch.arange(L)]
                packed = pack_rows(ids, pos)
                shapes[(q, L)] = lambda p=packed: model.forward_packed(*p, None, "full")
            else:
                kv = model.new_kv(len(windows), L)
                ids = [torch.full((n,), c.mask_token_id) for n in windows]
                pos = [torch.arange(L - n, L) for n in windows]
                packed = pack_rows(ids, pos)
                shapes[(q, L)] = lambda p=packed, k=kv: model.forward_packed(*p, k, "dual")
    times: dict[tuple[int, int], list[float]] = {k: [] for k in shapes}
    for fn in shapes.values():  # warm-up
        fn()
    for _ in range(repeats):
        for k, fn in shapes.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    points = [(q, L, statistics.median(ts)) for (q, L), ts in times.items()]
    if source is None:
        import platform

        source = (
            f"measured on this machine ({platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads)"
        )
    return fit(points, source)


def load(path: str) -> StepTimeModel:
    """A saved model (``save``) or a GPU step benchmark JSON (``bench_gpu_step.py``); errors name the file."""
    from .errors import CheckpointError, read_json_file

    try:
        data = read_json_file(path, "file", 64 << 20)
    except CheckpointError as e:  # "PATH: file not found", "PATH: not valid JSON (...)", ...
        raise ValueError(f"step-time file {e}") from None
    if isinstance(data, dict) and data.get("step_time_model") == FORMAT:
        try:
            a, b, c, d = (float(data["coef"][n]) for n in NAMES)
            points = tuple((int(p["query_tokens"]), int(p["L"]), float(p["seconds"])) for p in data.get("points", []))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f'step-time file {path}: bad "coef" / "points" ({e!r})') from None
        return StepTimeModel((a, b, c, d), str(data.get("source", path)), points)
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        try:
            timed = [
                (int(r["query_tokens"]), int(r["L"]), float(r["native_eager_ms"]) / 1e3)
                for r in data["results"]
                if "native_eager_ms" in r
            ]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(
                f"step-time file {path}: a result lacks query_tokens / L / native_eager_ms ({e!r})"
            ) from None
        if len(timed) < 2:
            raise ValueError(f'step-time file {path}: fewer than 2 timed steps in "results"')
        device = data.get("device", "GPU")
        params = data.get("params")
        shape = f"{params / 1e9:.0f}B-parameter model" if isinstance(params, (int, float)) else "its model"
        return fit(timed, f"{device}, {shape} ({os.path.basename(path)})")
    raise ValueError(
        f'step-time file {path}: neither a step-time model ("step_time_model": {FORMAT}) nor a '
        f'GPU step benchmark JSON ("results" with query_tokens, L, native_eager_ms)'
    )
