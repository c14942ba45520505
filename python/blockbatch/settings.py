"""Every ``BLOCKBATCH_*`` environment variable, in one table.

The CUDA kernels' choices are read in C++ by the ops layer (``csrc/ops/cuda/settings.cpp``:
``env_choice`` / ``env_int`` and the ``kDefault*`` block at its top); the build options are read by
``setup.py``. This table is what the
rest derives from:

- ``blockbatch generate --help``: :func:`help_text`;
- the table of ``docs/install.md`` ("Environment variables"): :func:`docs_table`
  (``python -m blockbatch.settings docs`` rewrites it);
- the benchmarks' opt-in kernels: :func:`candidates` (``benchmarks/common.py`` ``CANDIDATES``);
- ``benchmarks/gpu_summary.py``'s verdict tests and ``gpu_check.sh``'s candidate test processes:
  :func:`candidate_tests`, :func:`candidate_test_groups`;
- the ``candidate`` pytest mark of ``tests/cuda/test_cuda.py``: :func:`param`, :func:`candidate_mark`.

``tests/tools/test_settings.py`` checks that the C++ reads agree with the table (names, choices, ranges,
defaults) and that no source reads a ``BLOCKBATCH_*`` variable the table lacks.

Status: ``promoted`` (the default was checked and timed on a GPU), ``candidate`` (the variable has
opt-in values that no GPU run has checked and timed yet; they stay off until one has) or ``build``
(a build option of ``setup.py``). Why each candidate exists and what it is expected to gain:
``docs/bench/gpu/NOTES.md``. Promoting one: change its ``default`` / ``status`` here and the matching
``kDefault*`` line of ``settings.cpp`` (a test compares the two), then rerun ``gpu_check.sh``.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Optional

NOTES = "docs/bench/gpu/NOTES.md"


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # "choice" | "int" | "bool" (a "0"/"1" choice) | "build" | "text"
    doc: str  # one line (wrapped by the renderers)
    default: Optional[str]  # None: automatic (a heuristic's choice) / unset
    status: str  # "promoted" | "candidate" | "build"
    choices: tuple[str, ...] = ()  # kind choice / bool: the accepted values, in C++'s order
    range: Optional[tuple[int, int]] = None  # kind int: [lo, hi]
    candidates: tuple[str, ...] = ()  # the opt-in values no GPU run has checked and timed yet
    # "runtime" (read per launch by _C) | "build" (read by setup.py) | "serve" | "load" (read by the checkpoint
    # loaders: python/blockbatch/loading.py and csrc/io/checkpoint.cpp of the bb_* binaries)
    scope: str = "runtime"

    @property
    def syntax(self) -> str:
        """NAME=values, as --help and the docs show it (the default first for a choice)."""
        if self.kind == "int":
            assert self.range is not None  # every int setting of the table has its range
            return f"{self.name}={self.range[0]}..{self.range[1]}"
        if self.kind in ("choice", "bool"):
            first = [self.default] if self.default in self.choices else []
            return f"{self.name}=" + "|".join(first + [c for c in self.choices if c not in first])
        return f"{self.name}=..."

    @property
    def default_text(self) -> str:
        return "automatic" if self.default is None else self.default


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "BLOCKBATCH_ATTN_KERNEL",
        "choice",
        "tensor-core attention kernel: 3 (pipelined3) or 2 (pipelined) cp.async K/V stages, or K/V staged "
        "through registers (sync); same bits",
        default="pipelined3",
        status="promoted",
        choices=("sync", "pipelined", "pipelined3"),
    ),
    Setting(
        "BLOCKBATCH_ATTN_SPLITS",
        "int",
        "force attention's key-split count",
        default=None,
        status="promoted",
        range=(1, 16),
    ),
    Setting(
        "BLOCKBATCH_ROPE_KERNEL",
        "choice",
        "16-byte RoPE + KV-slot write (vec); same bits",
        default="vec",
        status="promoted",
        choices=("scalar", "vec"),
    ),
    Setting(
        "BLOCKBATCH_CUDA_BATCHING",
        "choice",
        "batch the requests of a CUDA model in the scheduler (Engine.generate with max_batch > 1, "
        "Engine.stream, generate --input, serve): graphs: each packed step padded to bucketed sizes and "
        "replayed from a CUDA graph; 1: eager packed steps on one stream; 0: one by one",
        default="graphs",
        status="promoted",
        choices=("0", "1", "graphs"),
    ),
    Setting(
        "BLOCKBATCH_BATCH_INVARIANT",
        "bool",
        "batch-invariant forward: GEMMs in fixed 256-row chunks (zero-padded) and unsplit attention, so a "
        "request's logits on the GPU do not depend on what shares its forwards (batch 1 included); costs "
        "about 20% at LLaDA-8B shape (bf16, dual, batch 16 on an H200: 12.1 requests/s against 14.9)",
        default="0",
        status="promoted",
        choices=("0", "1"),
    ),
    Setting(
        "BLOCKBATCH_MOE_KERNEL",
        "choice",
        "mixture-of-experts layers (LLaDA2) on CUDA: one cuBLAS GEMM per active expert with the router's "
        "choices read on the host (grouped; no CUDA graph for the model), or kernels that keep them on the "
        "device (fused; graph-captured steps)",
        default="grouped",
        status="candidate",
        choices=("grouped", "fused"),
        candidates=("fused",),
    ),
    Setting(
        "BLOCKBATCH_API_KEY",
        "text",
        "blockbatch serve: the API key clients must send (Authorization: Bearer KEY), when neither --api-key "
        "nor --api-key-file is given; not on the command line, where other users can read it",
        default=None,
        status="promoted",
        scope="serve",
    ),
    Setting(
        "BLOCKBATCH_CHECK_FINITE",
        "bool",
        "checkpoint loading (Python loader, bb_* binaries): refuse a weight holding NaN / Inf, naming it (0: skip "
        "the check, about 0.15 s (float32) to 0.25 s (bfloat16) per GB on one CPU thread; "
        "Engine.from_pretrained(check_finite=False) likewise)",
        default="1",
        status="promoted",
        choices=("0", "1"),
        scope="load",
    ),
    Setting(
        "BLOCKBATCH_CUDA",
        "build",
        "setup.py: build the CUDA kernels (0/OFF/off: CPU only; unset: when torch has CUDA and "
        "CUDA_HOME holds the toolkit)",
        default=None,
        status="build",
        scope="build",
    ),
    Setting(
        "BLOCKBATCH_SANITIZE",
        "build",
        "setup.py: sanitizers for the C++ core, _C and bb_*, e.g. address,undefined (own build folder)",
        default=None,
        status="build",
        scope="build",
    ),
    Setting(
        "BLOCKBATCH_REQUIRE_CPP_TESTS",
        "build",
        "tests/tools/test_cpp_units.py: 1 fails where the C++ unit tests (bb_unit_tests, doctest) cannot run "
        "instead of skipping (CI: .ci/run sets it after installing doctest-dev)",
        default=None,
        status="build",
        scope="build",
    ),
)

BY_NAME = {s.name: s for s in SETTINGS}


def get(name: str) -> Setting:
    return BY_NAME[name]


def value(name: str) -> str:
    """The value of runtime variable ``name`` now: the environment's, or the table's default when
    unset or empty; a value outside its choices raises ValueError naming the variable (as _C does)."""
    import os

    s = BY_NAME[name]
    v = os.environ.get(name, "") or (s.default or "")
    if s.choices and v not in s.choices:
        quoted = [repr(c) for c in s.choices]
        allowed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        raise ValueError(f"{name} must be {allowed}, got {v!r}")  # as _C's env_choice says it
    return v


def runtime() -> list[Setting]:
    """The variables _C reads at every launch (the CUDA kernels' choices)."""
    return [s for s in SETTINGS if s.scope == "runtime"]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """An opt-in kernel the GPU benchmarks time against the defaults (benchmarks/common.py CANDIDATES)."""

    name: str  # the benchmarks' key (bench_gpu_candidates.json, gpu_summary's verdicts)
    env: dict  # the variables it sets
    doc: str
    tests: tuple[str, ...]  # tests/cuda/test_cuda.py names (substrings) that must pass before promotion
    group: str  # gpu_check.sh: the candidate-test process its tests run in
    in_all: bool = True  # part of the "all" candidate (every opt-in kernel together)
    # What bench_gpu_step --part candidates times it on: "llada" (the LLaDA-8B-shaped steps and
    # gpu_decode_check's decodes) or "llada2" (LLaDA2-mini-shaped steps: a kernel only that family runs).
    model: str = "llada"


# In the order they are timed: least risky first, since a kernel that faults ends its process's CUDA
# context and with it the timings of every candidate after it.
# None is left after the 2026-12-04 GPU run (docs/bench/gpu/NOTES.md): its winners were promoted and
# the others deleted. A new opt-in kernel adds its row here, e.g.
#   Candidate("rope_vec", {"BLOCKBATCH_ROPE_KERNEL": "vec"}, "16-byte rope_kv_write",
#             ("rope_kv_write_cuda",), "rope_vec"),
CANDIDATES: tuple[Candidate, ...] = (
    Candidate(
        "moe_fused",
        {"BLOCKBATCH_MOE_KERNEL": "fused"},
        "MoE experts on the device's router choices (kernels/cuda/moe.cu): capturable LLaDA2 steps",
        ("moe_experts_cuda", "llada2_cuda"),
        "moe",
        in_all=False,
        model="llada2",
    ),
)

# gpu_check.sh's candidate-test processes (pytest -k expressions), one per group. A test of a
# group's own (not a verdict's borrowed one) belongs here; its order is the run order.
TEST_GROUPS: tuple[tuple[str, str], ...] = (("moe", "moe_experts_cuda or llada2_cuda"),)


def candidates(model: Optional[str] = None) -> dict[str, dict]:
    """{candidate name: its environment}, in timing order, then "all": every in_all one together
    (when there is one).

    Only the values the table still lists as candidates: a promoted one drops out. Empty (no
    "all" either) when no kernel candidate is left. ``model``: only those timed on that model
    ("llada" or "llada2", Candidate.model).
    """
    live = [c for c in CANDIDATES if _still_candidate(c) and (model is None or c.model == model)]
    out = {c.name: dict(c.env) for c in live}
    every: dict = {}
    for c in live:
        if c.in_all:
            every.update(c.env)
    if every:
        out["all"] = every
    return out


def _still_candidate(c: Candidate) -> bool:
    return all(v in BY_NAME[k].candidates for k, v in c.env.items())


def candidate_tests() -> dict[str, tuple[str, ...]]:
    """{candidate name: the test names (substrings) that must pass before it may become the default}."""
    return {c.name: c.tests for c in CANDIDATES if _still_candidate(c)}


def candidate_test_groups() -> list[tuple[str, str]]:
    """gpu_check.sh's candidate test processes: [(name, pytest -k expression)]."""
    live = {c.group for c in CANDIDATES if _still_candidate(c)}
    return [(g, expr) for g, expr in TEST_GROUPS if g in live]


def is_candidate(name: str, value: Optional[str] = None) -> bool:
    """Whether `name` (or its value `value`) is an opt-in no GPU run has checked and timed yet."""
    s = BY_NAME[name]
    return s.status == "candidate" if value is None else value in s.candidates


def param(name: str, value: str):
    """A pytest.param of `value`, marked ``candidate`` while the table lists it as one."""
    import pytest

    return pytest.param(value, marks=pytest.mark.candidate) if is_candidate(name, value) else pytest.param(value)


def candidate_mark(*names: str):
    """pytest.mark.candidate while any of `names` is a candidate variable, else pytest.mark.promoted
    (a mark with no effect; a real Mark either way, usable as a decorator and in ``pytestmark``)."""
    import pytest

    if any(is_candidate(n) for n in names):
        return pytest.mark.candidate
    return pytest.mark.promoted


# --- renderers ---------------------------------------------------------------------------------

HELP_WIDTH = 41  # where the descriptions of `generate --help`'s environment block start


def _describe(s: Setting) -> str:
    text = f"{s.doc} (default\0{s.default_text}"  # \0: kept on one line by help_text's wrapping
    if s.candidates:
        text += "; opt-in candidate" + ("s " if len(s.candidates) > 1 else " ") + ", ".join(s.candidates)
    elif s.status == "candidate":
        text += "; candidate"
    return text + ")"


def help_text() -> str:
    """The environment-variable blocks of `blockbatch generate --help`: the CUDA kernels' and the
    checkpoint loader's."""
    lines = [
        "CUDA kernels (environment variables, read at every launch; --device cuda only;",
        f"candidates are opt-in until a GPU run has timed them: {NOTES}):",
    ]
    lines += _help_rows(runtime())
    lines += ["", "checkpoint loading (environment variables, read at every load):"]
    lines += _help_rows([s for s in SETTINGS if s.scope == "load"])
    return "\n".join(lines)


def _help_rows(settings: list[Setting]) -> list[str]:
    lines = []
    for s in settings:
        head = "  " + s.syntax
        body = [b.replace("\0", " ") for b in textwrap.wrap(_describe(s), 100 - HELP_WIDTH)]
        if len(head) + 1 <= HELP_WIDTH:
            lines.append(head.ljust(HELP_WIDTH) + body[0])
            body = body[1:]
        else:
            lines.append(head)
        lines += [" " * HELP_WIDTH + b for b in body]
    return lines


DOCS_BEGIN = "<!-- settings table: generated by `python -m blockbatch.settings docs`; do not edit -->"
DOCS_END = "<!-- end of settings table -->"


def docs_table() -> str:
    """The table of every BLOCKBATCH_* variable in docs/install.md (a Markdown table)."""
    rows = ["| variable | values | default | status | what it does |", "| --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        if s.kind == "int":
            assert s.range is not None  # every int setting of the table has its range
            values = f"{s.range[0]}..{s.range[1]}"
        elif s.kind in ("choice", "bool"):
            values = ", ".join(f"`{c}`" for c in s.choices)
        elif s.kind == "text":
            values = "text"
        else:
            values = "(build option)"
        status = s.status + (" (" + ", ".join(f"`{c}`" for c in s.candidates) + ")" if s.candidates else "")
        default = (
            "automatic"
            if s.default is None and s.scope == "runtime"
            else "unset"
            if s.default is None
            else f"`{s.default}`"
        )
        rows.append(f"| `{s.name}` | {values} | {default} | {status} | {s.doc} |")
    return "\n".join(rows)


def replace_docs_table(text: str) -> str:
    """`text` (docs/install.md) with the part between the table markers replaced by docs_table()."""
    start, end = text.index(DOCS_BEGIN) + len(DOCS_BEGIN), text.index(DOCS_END)
    return text[:start] + "\n" + docs_table() + "\n" + text[end:]


def main(argv=None) -> int:
    import argparse
    import pathlib

    ap = argparse.ArgumentParser(description="Render the BLOCKBATCH_* settings table.")
    ap.add_argument(
        "what",
        choices=("help", "docs", "table", "test-groups"),
        help="help: print the --help block; docs: rewrite docs/install.md's table in place "
        "(--page); table: print the Markdown table; test-groups: gpu_check.sh's "
        "candidate test processes, one 'name:pytest -k expression' a line",
    )
    ap.add_argument("--page", default=str(pathlib.Path(__file__).resolve().parents[2] / "docs" / "install.md"))
    args = ap.parse_args(argv)
    if args.what == "help":
        print(help_text())
    elif args.what == "table":
        print(docs_table())
    elif args.what == "test-groups":
        for name, expr in candidate_test_groups():
            print(f"{name}:{expr}")
    else:
        path = pathlib.Path(args.page)
        new = replace_docs_table(path.read_text(encoding="utf-8"))
        path.write_text(new, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
