"""Find and load the compiled extension (``_C*.so``) exactly once."""

from __future__ import annotations

import glob
import json
import os

import torch

_loaded: str | None = None
_BUILD = (
    "Build it with `pip install --no-build-isolation -e .` or, in a source tree, "
    "`python setup.py build_ext --inplace` (see README.md)."
)


def load_extension() -> str:
    """Load ``blockbatch/_C*.so`` (newest wins if a setup.py and a CMake build both left one).

    Raises ImportError naming the folder (missing library) or the file and the loader's reason
    (a library that does not load, e.g. built against another torch).
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")), key=os.path.getmtime, reverse=True)
    if not candidates:
        raise ImportError(f"blockbatch's C++ extension was not found in {here}. {_BUILD}")
    check_torch_version(here)
    try:
        torch.ops.load_library(candidates[0])
    except (OSError, RuntimeError) as e:
        raise ImportError(
            f"blockbatch's C++ extension {candidates[0]} does not load ({e}). Rebuild it against "
            f"the installed torch {torch.__version__}: {_BUILD}"
        ) from e
    _loaded = candidates[0]
    return _loaded


def try_load_extension() -> bool:
    """``load_extension`` when the library is there; False (no error) when it is missing or broken."""
    try:
        load_extension()
    except ImportError:
        return False
    return True


def check_torch_version(package_dir: str) -> None:
    """Raise ImportError when _C was built against another torch than the one running.

    setup.py records the build's torch in ``bin/build_info.json``; libtorch's C++ ABI changes
    between releases, so a mismatch would otherwise surface as an undefined symbol (or worse).
    A build without that file (a plain CMake build) is not checked.
    """
    try:
        with open(os.path.join(package_dir, "bin", "build_info.json")) as f:
            built = json.load(f)["torch"]
    except (OSError, ValueError, KeyError):
        return
    if built.split("+")[0] != torch.__version__.split("+")[0]:
        raise ImportError(
            f"blockbatch's C++ extension was built against torch {built}, running torch {torch.__version__}: "
            f"rebuild with `pip install --no-build-isolation --no-deps -e .` (source checkout) or install "
            f"torch=={built.split('+')[0]} (a wheel requires the torch it was built with)"
        )
