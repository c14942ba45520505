"""Builds the CPU CUDA emulator library (cuda_emu.h): csrc/kernels/cuda/*.cu compiled as C++ by the
host compiler, with the emulator's runtime and C entry points (api.cpp).

Needs a C++17 compiler and the CUDA toolkit's headers (cuda_runtime.h, cuda_bf16.h: found under
$CUDA_HOME/include or /usr/local/cuda/include); no GPU, no nvcc. The library is cached under
build/cuda-emu/<hash of every input>/, so an unchanged tree is not rebuilt.

    python tests/emu/cuda_emu/build.py      # build (or find) it and print its path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
KERNELS = ROOT / "csrc" / "kernels" / "cuda"
# Translation units: every kernel file, then the emulator's own (selftest.cu: kernels with known faults).
SOURCES = sorted(KERNELS.glob("*.cu")) + [HERE / "runtime.cpp", HERE / "api.cpp", HERE / "selftest.cu"]


def cuda_include() -> Path | None:
    """The toolkit's include folder (holding cuda_runtime.h and cuda_bf16.h), or None."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if (
            root
            and (Path(root) / "include" / "cuda_runtime.h").is_file()
            and (Path(root) / "include" / "cuda_bf16.h").is_file()
        ):
            return Path(root) / "include"
    return None


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _flags(include: Path) -> list[str]:
    return [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-g0",
        "-ffp-contract=off",
        "-include",
        str(HERE / "cuda_emu.h"),
        f"-I{HERE / 'include'}",
        f"-I{ROOT / 'csrc'}",
        f"-I{include}",
    ]


def _digest(cxx: str, include: Path) -> str:
    h = hashlib.sha256()
    inputs = sorted(
        {
            *SOURCES,
            *KERNELS.glob("*.cuh"),
            *HERE.rglob("*.h"),
            ROOT / "csrc/kernels/branches.h",
            ROOT / "csrc/kernels/cpu/kernels.h",
            HERE / "build.py",
        }
    )
    for p in inputs:
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    h.update(" ".join([cxx, *_flags(include)]).encode())
    return h.hexdigest()[:16]


def build(out_root: Path = ROOT / "build" / "cuda-emu", jobs: int | None = None) -> Path:
    """Path of the emulator library, built if no library of these exact inputs exists. Raises
    RuntimeError naming what is missing (compiler, CUDA headers) or the compiler's errors."""
    cxx, include = compiler(), cuda_include()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set CXX, or install g++)")
    if include is None:
        raise RuntimeError(
            "no CUDA toolkit headers: set CUDA_HOME to the toolkit root (the folder holding include/cuda_runtime.h)"
        )
    out = out_root / _digest(cxx, include)
    lib = out / "libbbemu.so"
    if lib.is_file():
        return lib
    out.mkdir(parents=True, exist_ok=True)

    def compile_one(src: Path) -> tuple[Path, str | None]:
        obj = out / (src.name + ".o")
        lang = ["-x", "c++"] if src.suffix == ".cu" else []
        r = subprocess.run(
            [cxx, *_flags(include), *lang, "-c", str(src), "-o", str(obj)], capture_output=True, text=True
        )
        return obj, (f"{src.relative_to(ROOT)}:\n{r.stderr[-4000:]}" if r.returncode else None)

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 2) as pool:
        results = list(pool.map(compile_one, SOURCES))
    errors = [e for _, e in results if e]
    if errors:
        raise RuntimeError("building the CUDA emulator failed:\n" + "\n".join(errors))
    tmp = out / "libbbemu.so.tmp"
    r = subprocess.run([cxx, "-shared", "-o", str(tmp), *[str(o) for o, _ in results]], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"linking the CUDA emulator failed:\n{r.stderr[-4000:]}")
    tmp.replace(lib)  # atomic: a concurrent or interrupted build never leaves half a library
    return lib


if __name__ == "__main__":
    try:
        print(build())
    except RuntimeError as e:
        sys.exit(str(e))
