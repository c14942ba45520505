"""Bounded runs of the atheris fuzz targets (fuzz_loaders.py) and a replay of the seed corpus.

Each target runs in a subprocess with a wall-clock timeout and an 8 GiB address-space cap, for a
fixed number of inputs (a few thousand: seconds each). The only exceptions allowed to escape are
the documented ones (CheckpointError naming the file; for the C++ model target ValueError /
RuntimeError naming a config key or weight): anything else makes the target exit nonzero and
the test fail with libFuzzer's report and the offending input.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

import blockbatch
from blockbatch.config import ModelConfig
from blockbatch.errors import CheckpointError
from blockbatch.loading import read_safetensors_header

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
TARGET = os.path.join(HERE, "fuzz_loaders.py")
RUNS = 2000
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(blockbatch.__file__)), os.environ.get("PYTHONPATH", "")]
    ),
}


def _corpus(kind: str) -> list[str]:
    folder = os.path.join(CORPUS, kind)
    return sorted(os.path.join(folder, name) for name in os.listdir(folder))


def test_corpus_is_small_and_present():
    files = _corpus("header") + _corpus("config")
    assert 40 <= len(files) <= 100
    assert all(os.path.getsize(f) <= 16 << 10 for f in files)


@pytest.mark.parametrize("path", _corpus("header"), ids=os.path.basename)
def test_header_corpus_replay(path):
    """Each seed is accepted (the valid_* ones) or refused with a CheckpointError naming the file."""
    name = os.path.basename(path)
    if name.startswith("valid_"):
        read_safetensors_header(path)
    else:
        with pytest.raises(CheckpointError, match="^" + path.replace("\\", "\\\\")):
            read_safetensors_header(path)


@pytest.mark.parametrize("path", _corpus("config"), ids=os.path.basename)
def test_config_corpus_replay(path):
    name = os.path.basename(path)
    if name.startswith(("valid_", "bom")):
        ModelConfig.from_json_file(path)
    else:
        with pytest.raises(CheckpointError, match="^" + path) as info:
            ModelConfig.from_json_file(path)
        text = str(info.value)
        # A well-formed JSON object's problem is always a named key.
        if not name.startswith(("not_utf8", "top_level", "truncated", "deep", "int_5000", "duplicate")):
            assert "key '" in text, text


def _fuzz(tmp_path, target: str, corpus_kind: str | None, runs: int = RUNS):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    if corpus_kind:
        for f in _corpus(corpus_kind):
            shutil.copy(f, corpus)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    cmd = [
        sys.executable,
        TARGET,
        target,
        f"-runs={runs}",
        "-max_len=4096",
        "-seed=1",
        "-timeout=20",
        "-rss_limit_mb=6000",
        f"-artifact_prefix={artifacts}/",
        str(corpus),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=ENV, cwd=tmp_path)
    found = sorted(os.listdir(artifacts))
    assert res.returncode == 0 and not found, f"fuzz target {target} found {found}:\n{res.stderr[-4000:]}"
    assert f"Done {runs} runs" in res.stderr, res.stderr[-2000:]


needs_atheris = pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed")


@needs_atheris
def test_fuzz_safetensors_header(tmp_path):
    _fuzz(tmp_path, "header", "header")


@needs_atheris
def test_fuzz_config_parser(tmp_path):
    _fuzz(tmp_path, "config", "config")


@needs_atheris
def test_fuzz_cpp_model_config(tmp_path):
    from blockbatch._C_loader import try_load_extension

    if not try_load_extension():
        pytest.skip("the C++ extension is not built")
    _fuzz(tmp_path, "model", None, runs=500)
