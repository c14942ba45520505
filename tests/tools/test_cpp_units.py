"""The C++ unit tests (tests/cpp: the policy table's invariants, each policy's decoder on a fake
``Network``, the stop rule, admission refusals) run through their doctest binary, ``bb_unit_tests``.

CMake builds it where doctest's header is found (Debian / Ubuntu: ``apt-get install doctest-dev``)
and an editable build places it in build/bin (setup.py). Without the header this test skips, naming
the package; with ``BLOCKBATCH_REQUIRE_CPP_TESTS=1`` (CI: .ci/run) it fails instead, so the unit
tests cannot silently drop out of a run that is meant to have them.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "build" / "bin" / "bb_unit_tests"
HEADER = pathlib.Path("doctest") / "doctest.h"
INSTALL = "apt-get install doctest-dev"


def _include_dirs() -> list[pathlib.Path]:
    """Where CMake's find_path(DOCTEST_INCLUDE doctest/doctest.h) looks, roughly."""
    dirs = [p for var in ("CPATH", "CPLUS_INCLUDE_PATH") for p in os.environ.get(var, "").split(os.pathsep) if p]
    dirs += [os.path.join(p, "include") for p in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    return [pathlib.Path(d) for d in [*dirs, "/usr/include", "/usr/local/include"]]


def doctest_header() -> pathlib.Path | None:
    return next((d / HEADER for d in _include_dirs() if (d / HEADER).is_file()), None)


def _missing(reason: str) -> None:
    if os.environ.get("BLOCKBATCH_REQUIRE_CPP_TESTS") == "1":
        pytest.fail(f"{reason} (BLOCKBATCH_REQUIRE_CPP_TESTS=1: the C++ unit tests must run)")
    pytest.skip(reason)


def test_cpp_unit_tests_pass():
    if not BINARY.exists():
        if doctest_header() is None:
            _missing(f"the C++ unit tests need doctest's header {HEADER}: `{INSTALL}`, then rebuild")
        _missing(
            f"{BINARY.relative_to(ROOT)} is missing although {doctest_header()} exists: rebuild "
            "(`pip install --no-build-isolation --no-deps -e .` or `python setup.py build_ext --inplace`)"
        )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    lib = pathlib.Path(torch.__file__).parent / "lib"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH"), str(lib)) if p)
    run = subprocess.run([str(BINARY)], capture_output=True, text=True, timeout=600, env=env)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, f"bb_unit_tests failed (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    assert "Status: SUCCESS!" in run.stdout, run.stdout


def test_every_test_file_is_built():
    """Each tests/cpp/*.cpp is a source of bb_unit_tests in CMakeLists.txt (a file left out would never run)."""
    cmake = (ROOT / "CMakeLists.txt").read_text(encoding="utf-8")
    sources = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "cpp").glob("*.cpp"))
    assert sources and not [s for s in sources if s not in cmake], sources
