"""The C++ layers point only down (.ci/check_layers.py): kernels < ops < model < decode < torch,
io may include model / ops / kernels, and only csrc/torch includes TorchBind or op registration.
Pure Python, no build needed."""

import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "check_layers.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_include_points_down():
    r = subprocess.run([sys.executable, str(SCRIPT), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "layers OK" in r.stdout


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_check_fails_on_an_upward_include(tmp_path):
    """Not vacuous: a synthetic tree with includes that point up is reported, file:line and rule, and
    the script exits 1; the same tree with them removed passes."""
    _write(tmp_path, "csrc/kernels/cuda/launch.cuh", '#pragma once\n#include "kernels/cuda/kernels.cuh"\n')
    _write(tmp_path, "csrc/ops/ops.h", '#pragma once\n#include <ATen/core/Tensor.h>\n#include "kernels/branches.h"\n')
    _write(tmp_path, "csrc/model/model.h", '#pragma once\n#include "ops/ops.h"\n#include <torch/custom_class.h>\n')
    _write(tmp_path, "csrc/decode/step.cpp", '#include "model/network.h"\n\n  #  include "torch/ops.h"\n')
    _write(tmp_path, "csrc/kernels/cpu/x.cpp", '#include "ops/checks.h"\n')
    _write(tmp_path, "csrc/io/checkpoint.cpp", '#include "model/model.h"\n#include "decode/decode.h"\n')
    _write(tmp_path, "csrc/torch/bindings.cpp", '#include <torch/library.h>\n#include "decode/decode.h"\n')
    _write(
        tmp_path,
        "benchmarks/cpp/bb_x.cpp",
        '#include "common.h"\n#include "decode/decode.h"\n#include "torch/model_handle.h"\n',
    )
    found = {(v.path, v.line): v.rule for v in _checker().check_tree(tmp_path)}
    assert set(found) == {
        ("csrc/model/model.h", 3),
        ("csrc/decode/step.cpp", 3),
        ("csrc/kernels/cpu/x.cpp", 1),
        ("csrc/io/checkpoint.cpp", 2),
        ("benchmarks/cpp/bb_x.cpp", 3),
    }, found
    assert "only csrc/torch/ may include <torch/custom_class.h>" in found[("csrc/model/model.h", 3)]
    assert "csrc/decode must not include csrc/torch" in found[("csrc/decode/step.cpp", 3)]
    assert "csrc/kernels must not include csrc/ops" in found[("csrc/kernels/cpu/x.cpp", 1)]

    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert 'csrc/decode/step.cpp:3: #  include "torch/ops.h"' in r.stdout
    assert "5 include(s) point up a layer" in r.stderr

    for rel, text in [
        ("csrc/model/model.h", '#pragma once\n#include "ops/ops.h"\n'),
        ("csrc/decode/step.cpp", '#include "model/network.h"\n'),
        ("csrc/kernels/cpu/x.cpp", '#include "kernels/cpu/kernels.h"\n'),
        ("csrc/io/checkpoint.cpp", '#include "model/model.h"\n'),
        ("benchmarks/cpp/bb_x.cpp", '#include "common.h"\n#include "decode/decode.h"\n'),
    ]:
        _write(tmp_path, rel, text)
    assert _checker().check_tree(tmp_path) == []
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
