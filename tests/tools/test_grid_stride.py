"""``--grid-stride K`` (tests/conftest.py), which .ci/sanitize uses: it keeps every K-th case of each
test marked ``grid`` and nothing else changes, and the sample .ci/sanitize takes (K = 5) still
varies every factor of the BlockBatch parity grid."""

from __future__ import annotations

import subprocess
import sys

from helpers.serve import ROOT

GRID_TEST = "tests/decode/test_blockbatch.py::test_grid_matches_reference"


def _collect(*args: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_stride_keeps_every_kth_grid_case_and_all_other_tests():
    everything = _collect("tests/decode/test_blockbatch.py")
    sampled = _collect("--grid-stride", "5", "tests/decode/test_blockbatch.py")
    grid = [t for t in everything if t.startswith(GRID_TEST + "[")]
    assert len(grid) > 20
    assert [t for t in sampled if t.startswith(GRID_TEST + "[")] == grid[::5]
    others = [
        t
        for t in everything
        if not t.startswith(GRID_TEST + "[")
        and not t.startswith("tests/decode/test_blockbatch.py::test_sync_refresh_variant_matches_reference[")
    ]
    assert [t for t in sampled if t in set(others)] == others  # unmarked tests all stay
    # The sample still takes every value of every factor of the grid.
    factors = ("block_sizes", "gen_length", "refresh_mode", "sync_gap", "merge_gate", "stop_on_eos")
    for name in factors:

        def values(ids):
            return {t.split(name, 1)[1].split("-", 1)[0].rstrip("]") for t in ids}

        assert values(grid[::5]) == values(grid), name


def test_bad_stride_is_a_usage_error():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "--grid-stride",
            "0",
            "tests/decode/test_blockbatch.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 4 and "--grid-stride must be >= 1" in r.stderr, (r.returncode, r.stderr)
