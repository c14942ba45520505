#!/usr/bin/env python3
"""Layer check of the C++ sources: every include points down.

    python .ci/check_layers.py [ROOT]      # exit status 1 and one line per violation

Layers under csrc/, lowest first (a file may include its own layer and any below it):

    kernels   raw-pointer CPU / CUDA kernels (kernels/cpu, kernels/cuda, kernels/branches.h)
    ops       tensor-level ops: dispatch wrappers, argument checks, CPU / CUDA / Meta implementations
    model     the Network interface and the LLaDA transformer
    decode    the denoising loop (sees model/network.h, never the TorchBind wrapper)
    torch     TorchBind Model and every op registration (the top)

csrc/io (checkpoint readers for the bb_* binaries) may include kernels, ops and model; no layer
includes io. benchmarks/cpp (the bb_* binaries) may include anything but torch/. Only csrc/torch
may include <torch/custom_class.h> or <torch/library.h> (TorchBind and op registration). Other
system and library headers (ATen, c10, CUDA) are not checked: the rules are about this project's
own layers. Pure Python, no build needed (tests/tools/test_layers.py runs it).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ORDER = ["kernels", "ops", "model", "decode", "torch"]
# What each group may include (besides standard / third-party headers).
ALLOWED = {layer: set(ORDER[: i + 1]) for i, layer in enumerate(ORDER)}
ALLOWED["io"] = {"kernels", "ops", "model", "io"}
BENCH_ALLOWED = {"kernels", "ops", "model", "decode", "io"}
TORCH_ONLY = ("torch/custom_class.h", "torch/library.h")
SUFFIXES = {".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    text: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text.strip()}  [{self.rule}]"


def _group(rel: Path) -> str | None:
    """The layer (or io / bench) a file belongs to, from its path relative to the root."""
    parts = rel.parts
    if len(parts) >= 2 and parts[0] == "csrc":
        return parts[1] if parts[1] in ALLOWED else None
    if len(parts) >= 2 and parts[:2] == ("benchmarks", "cpp"):
        return "bench"
    return None


def check_file(root: Path, path: Path) -> list[Violation]:
    rel = path.relative_to(root)
    group = _group(rel)
    if group is None:
        return []
    allowed = BENCH_ALLOWED if group == "bench" else ALLOWED[group]
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if not m:
            continue
        bracket, target = m.groups()
        if target in TORCH_ONLY:
            if group != "torch":
                out.append(Violation(str(rel), n, line, f"only csrc/torch/ may include <{target}> "
                                     "(TorchBind and op registration live at the top)"))
            continue
        if bracket != '"':
            continue
        head = target.split("/", 1)[0]
        if head not in ALLOWED or "/" not in target:
            continue  # a header next to the file (benchmarks/cpp/common.h) or not the project's
        if head not in allowed:
            if group == "bench":
                rule = f"benchmarks/cpp may include {', '.join(sorted(BENCH_ALLOWED))}, not {head}/"
            elif head == "io":
                rule = f"csrc/{group} must not include csrc/io (only the bb_* binaries use it)"
            else:
                rule = (f"csrc/{group} must not include csrc/{head}: a layer includes only itself and the "
                        f"layers below it ({' < '.join(ORDER)}; io may include kernels, ops, model)")
            out.append(Violation(str(rel), n, line, rule))
    return out


def check_tree(root: Path) -> list[Violation]:
    files = [p for d in ("csrc", "benchmarks/cpp") for p in sorted((root / d).rglob("*"))
             if p.is_file() and p.suffix in SUFFIXES]
    return [v for f in files for v in check_file(root, f)]


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = check_tree(root)
    for v in violations:
        print(v)
    if violations:
        print(f"error: {len(violations)} include(s) point up a layer ({' < '.join(ORDER)})", file=sys.stderr)
        return 1
    print(f"layers OK: every include under csrc/ and benchmarks/cpp points down ({' < '.join(ORDER)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
