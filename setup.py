"""Thin driver: configure and build CMakeLists.txt, then place _C and the bb_* binaries.

Always install with --no-build-isolation so the build uses the torch already installed:
    pip install --no-build-isolation -e .
CUDA kernels build when the installed torch has CUDA and CUDA_HOME points at the toolkit root
(the folder holding include/cuda_runtime.h); set BLOCKBATCH_CUDA=0 to force a CPU-only build.

BLOCKBATCH_SANITIZE=address,undefined builds the C++ core with those sanitizers (-fsanitize=...,
-O1 -g) in its own build folder (build/cmake-*-san-address-undefined); see docs/install.md, "Building
with sanitizers", for running the tests under it.

The built package requires exactly the torch it was compiled against (torch==X.Y.Z): _C and the
bb_* binaries link libtorch, whose C++ ABI changes between releases. bin/build_info.json records
that torch for blockbatch._C_loader, which explains a mismatch instead of failing to load.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
BINARIES = ("bb_forward", "bb_bench_decode")
# The C++ unit tests (tests/cpp; built where doctest's header is found): never packaged. An editable
# build places them in build/bin, where tests/tools/test_cpp_units.py runs them.
UNIT_TESTS = "bb_unit_tests"
BASE_DEPENDENCIES = ["numpy", "safetensors", "tokenizers"]


def sanitizers():
    """BLOCKBATCH_SANITIZE=address,undefined (commas or semicolons) -> ["address", "undefined"]."""
    raw = os.environ.get("BLOCKBATCH_SANITIZE", "")
    return [s.strip() for s in raw.replace(";", ",").split(",") if s.strip()]


def torch_requirement():
    """torch==<the version we compile against> (its public part: a +cpu / +cu130 build matches)."""
    try:
        import torch
    except ImportError:  # metadata-only runs without torch (e.g. an sdist): any supported torch
        return "torch>=2.6"
    return f"torch=={torch.__version__.split('+')[0]}"


def cuda_requested():
    import torch

    flag = os.environ.get("BLOCKBATCH_CUDA")
    if flag is not None:
        return flag not in ("0", "OFF", "off", "")
    home = os.environ.get("CUDA_HOME")
    return torch.version.cuda is not None and bool(home) and os.path.exists(os.path.join(home, "include", "cuda_runtime.h"))


class CMakeBuild(build_ext):
    def run(self):
        # setuptools' build_ext clears `inplace` while it builds (and copies the extension into
        # the source tree afterwards): remember it, so that `setup.py build_ext --inplace` (the dev
        # loop) places the bb_* binaries and their RUNPATH as an editable install does.
        self._into_source = bool(self.inplace)
        super().run()

    def build_extension(self, ext):
        import torch

        tag = f"{sys.implementation.cache_tag}-torch{torch.__version__.split('+')[0]}"
        with_cuda = cuda_requested()
        san = sanitizers()
        tag += "-cuda" if with_cuda else ""
        tag += "-san-" + "-".join(san) if san else ""
        build_dir = os.path.join(ROOT, "build", f"cmake-{tag}")
        editable = bool(self.inplace or getattr(self, "_into_source", False) or getattr(self, "editable_mode", False))
        # Wheels: only $ORIGIN-relative RUNPATHs (CMakeLists.txt). Editable installs run _C and the
        # binaries from the source tree, outside site-packages: add this venv's torch/lib too.
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        out_dir = os.path.join(build_dir, "out")
        os.makedirs(build_dir, exist_ok=True)
        cmake = shutil.which("cmake") or "cmake"
        args = [
            cmake, "-S", ROOT, "-B", build_dir, "-G", "Ninja",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DBLOCKBATCH_OUTPUT_DIR={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DBLOCKBATCH_CUDA={'ON' if with_cuda else 'OFF'}",
            f"-DBLOCKBATCH_SANITIZE={';'.join(san)}",
            f"-DBLOCKBATCH_EXTRA_RPATH={torch_lib if editable else ''}",
        ]
        if with_cuda:
            home = os.environ["CUDA_HOME"]
            arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0").replace(".", "").replace("+PTX", "").split(";")[0]
            args += [f"-DCMAKE_CUDA_COMPILER={os.path.join(home, 'bin', 'nvcc')}",
                     f"-DCUDAToolkit_ROOT={home}", f"-DCUDA_TOOLKIT_ROOT_DIR={home}",
                     f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
            # A toolkit without nvrtc (e.g. only cudart + nvcc): use the one pip's CUDA torch ships.
            if not glob.glob(os.path.join(home, "lib*", "libnvrtc.so*")):
                nvrtc = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libnvrtc.so.*[0-9]"))
                if nvrtc:
                    args.append(f"-DCUDA_nvrtc_LIBRARY={os.path.realpath(sorted(nvrtc)[0])}")
        subprocess.check_call(args)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call([cmake, "--build", build_dir, "-j", jobs])
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(out_dir, "_C.so"), target)
        # The bb_* binaries ship inside the package (blockbatch/bin). Editable installs build in a
        # temporary folder and only copy the extension back, so also place them in the source tree.
        pkg_dirs = {os.path.dirname(target)}
        if editable:
            pkg_dirs.add(os.path.join(ROOT, "python", "blockbatch"))
        info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": with_cuda,
                "sanitize": san, "python": sys.implementation.cache_tag}
        for pkg_dir in pkg_dirs:
            bin_dir = os.path.join(pkg_dir, "bin")
            os.makedirs(bin_dir, exist_ok=True)
            for name in BINARIES:
                shutil.copy2(os.path.join(out_dir, name), os.path.join(bin_dir, name))
            with open(os.path.join(bin_dir, "build_info.json"), "w") as f:
                json.dump(info, f, indent=1)
                f.write("\n")
        if editable:
            self.place_unit_tests(out_dir)

    @staticmethod
    def place_unit_tests(out_dir):
        """build/bin/bb_unit_tests: this build's unit tests, or none (no stale copy) without doctest."""
        built = os.path.join(out_dir, UNIT_TESTS)
        dest = os.path.join(ROOT, "build", "bin", UNIT_TESTS)
        if os.path.exists(dest):
            os.remove(dest)
        if os.path.exists(built):
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(built, dest)


setup(
    install_requires=[torch_requirement(), *BASE_DEPENDENCIES],
    ext_modules=[Extension("blockbatch._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
)
