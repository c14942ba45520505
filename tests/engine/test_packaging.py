"""Packaging: relocatable RUNPATHs, the torch pin and its loader check, entry points, sdist contents,
the soak benchmark's command line. (.ci/check_wheel installs and runs a real wheel.)"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

import blockbatch
from blockbatch import _bin, _C_loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.dirname(blockbatch.__file__)


def runpath(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", out)
    return m[1].split(":") if m else []


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
@pytest.mark.parametrize(
    "name,rel",
    [
        ("_C", "$ORIGIN/../torch/lib"),
        ("bin/bb_forward", "$ORIGIN/../../torch/lib"),
        ("bin/bb_bench_decode", "$ORIGIN/../../torch/lib"),
    ],
)
def test_runpath_is_relative_to_the_installed_torch(name, rel):
    paths = (
        [os.path.join(PKG, name)]
        if name.startswith("bin/")
        else [p for p in os.listdir(PKG) if p.startswith("_C") and p.endswith(".so")]
    )
    path = paths[0] if name.startswith("bin/") else os.path.join(PKG, paths[0]) if paths else None
    if path is None or not os.path.exists(path):
        pytest.skip(f"{name} is not built")
    entries = runpath(path)
    if rel not in entries:
        pytest.skip(f"{path} predates the relocatable RUNPATH (rebuild): {entries}")
    assert entries[0] == rel, entries
    # No stray link directories of torch's own build machine; an absolute entry only for an
    # editable install (the build venv's torch/lib, for binaries run from the source tree).
    assert not any(e.startswith("/lib/intel64") or e.startswith("/lib/win") for e in entries), entries
    for extra in entries[1:]:
        assert extra == os.path.join(os.path.dirname(torch.__file__), "lib"), entries
    # Relative to the installed layout, $ORIGIN/.. is site-packages: torch/lib holds libtorch_cpu.so.
    site = os.path.dirname(os.path.dirname(torch.__file__))
    origin = os.path.join(site, "blockbatch", *name.split("/")[:-1])
    assert os.path.exists(os.path.normpath(os.path.join(rel.replace("$ORIGIN", origin), "libtorch_cpu.so")))


def test_loader_explains_a_torch_mismatch(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "build_info.json").write_text(json.dumps({"torch": "2.1.0+cpu"}))
    with pytest.raises(
        ImportError,
        match=rf"built against torch 2\.1\.0\+cpu, running torch "
        rf"{re.escape(torch.__version__)}: rebuild with `pip install",
    ):
        _C_loader.check_torch_version(str(tmp_path))


def test_loader_accepts_the_same_torch_and_unrecorded_builds(tmp_path):
    _C_loader.check_torch_version(str(tmp_path))  # no build_info.json (plain CMake build): not checked
    (tmp_path / "bin").mkdir()
    public = torch.__version__.split("+")[0]
    for built in (torch.__version__, public, public + "+cu130"):  # the local label does not matter
        (tmp_path / "bin" / "build_info.json").write_text(json.dumps({"torch": built}))
        _C_loader.check_torch_version(str(tmp_path))


def test_build_info_records_this_torch():
    path = os.path.join(PKG, "bin", "build_info.json")
    if not os.path.exists(path):
        pytest.skip("built before bin/build_info.json existed (rebuild)")
    with open(path) as f:
        assert json.load(f)["torch"] == torch.__version__


def test_installed_metadata_pins_the_build_torch():
    try:
        requires = importlib.metadata.requires("blockbatch") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("blockbatch is not installed (PYTHONPATH only)")
    pins = [r for r in requires if re.match(r"torch\s*==", r)]
    if not pins:
        pytest.skip(f"installed before the torch pin (rebuild): {requires}")
    assert pins == [f"torch=={torch.__version__.split('+')[0]}"]


def test_entry_point_usage_and_missing_binary(monkeypatch, capsys):
    assert _bin.main([]) == 2 and "usage: python -m blockbatch._bin" in capsys.readouterr().err
    assert _bin.main(["rm", "-rf"]) == 2
    monkeypatch.setattr(_bin, "binary_path", lambda name: "/nonexistent/" + name)
    assert _bin.exec_binary("bb_forward", ["--help"]) == 2
    assert "is missing or not executable" in capsys.readouterr().err


@pytest.mark.parametrize("name,flag", [("bb_forward", "--lengths"), ("bb_bench_decode", "--prompts")])
def test_packaged_binaries_run_through_the_entry_point(name, flag):
    if not os.access(_bin.binary_path(name), os.X_OK):
        pytest.skip(f"{name} is not built")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    res = subprocess.run(
        [sys.executable, "-m", "blockbatch._bin", name, "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    assert flag in res.stdout


def test_sdist_holds_the_sources_and_no_build_outputs(tmp_path):
    res = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    [sdist] = os.listdir(tmp_path)
    with tarfile.open(tmp_path / sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in (
        "CMakeLists.txt",
        "setup.py",
        "pyproject.toml",
        "MANIFEST.in",
        "csrc/model/transformer.cpp",
        "csrc/kernels/branches.h",
        "csrc/kernels/cuda/attention.cu",
        "benchmarks/cpp/bb_forward.cpp",
        "benchmarks/cpp/common.h",
        "python/blockbatch/toy/checkpoint/model.safetensors",
        "python/blockbatch/toy/checkpoint_dream/model.safetensors",
        "python/blockbatch/toy/checkpoint_dream/generation_config.json",
        "python/blockbatch/toy/checkpoint_llada2/model.safetensors",
        "python/blockbatch/toy/checkpoint_llada2_edit/model.safetensors",
        "python/blockbatch/_bin.py",
        "tests/ops/test_ops.py",
        "mkdocs.yml",
        "docs/index.md",
        "docs/options.md",
        "docs/bench/bench.json",
        "tools/gen_docs_bench.py",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.endswith(".so") or n.startswith("python/blockbatch/bin/") or "__pycache__" in n]


@pytest.mark.slow
def test_soak_benchmark_runs_and_reports(tmp_path):
    out = tmp_path / "soak.json"
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "soak.py"),
            "--n",
            "24",
            "--warmup",
            "8",
            "--window",
            "8",
            "--gen-length",
            "16",
            "--max-growth",
            "0.5",
            "--quiet",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    record = json.loads(out.read_text())
    assert len(record["rss_bytes"]) == 24 and record["verdict"]["passed"]
    assert sum(v["count"] for v in record["variants"].values()) == 24
    assert "RSS after warm-up" in res.stdout
    helptext = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "--max-growth" in helptext and "warm-up" in helptext
