"""BLOCKBATCH_CUDA_BATCHING, the batching scheduler on a CUDA model (on by default, "0" opts out), as
seen without a GPU: its value (checked as _C checks it), the CPU engine batching regardless, and
`blockbatch serve --device cuda` refusing, with the variable's name, when it is 0. The GPU side is
tests/cuda/test_cuda_batching.py."""

import pytest
import torch

from blockbatch import Engine, settings
from blockbatch.cli import main


def test_the_value_is_read_and_checked(monkeypatch):
    monkeypatch.delenv("BLOCKBATCH_CUDA_BATCHING", raising=False)
    assert settings.value("BLOCKBATCH_CUDA_BATCHING") == "graphs"
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "")
    assert settings.value("BLOCKBATCH_CUDA_BATCHING") == "graphs"
    for v in ("0", "1", "graphs"):
        monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", v)
        assert settings.value("BLOCKBATCH_CUDA_BATCHING") == v
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "on")
    with pytest.raises(ValueError, match="BLOCKBATCH_CUDA_BATCHING must be '0', '1' or 'graphs', got 'on'"):
        settings.value("BLOCKBATCH_CUDA_BATCHING")


def test_a_cpu_engine_batches_whatever_the_variable(monkeypatch):
    engine = Engine.from_pretrained()
    for value in ("0", "1"):
        monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", value)
        assert engine.batches
        engine.generate(["1+1=?", "2+2=?"], max_batch=2)
        assert engine.last_batch_stats["packed_forwards"] < engine.last_batch_stats["request_forwards"]


def test_serve_on_cuda_refuses_batching_off(monkeypatch, capsys):
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "0")
    assert main(["serve", "--device", "cuda"]) == 2
    assert (
        "--device cuda: the server decodes on the batching scheduler, which BLOCKBATCH_CUDA_BATCHING=0 "
        "turns off on CUDA" in capsys.readouterr().err
    )
    monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", "on")
    assert main(["serve", "--device", "cuda"]) == 2
    assert "BLOCKBATCH_CUDA_BATCHING must be '0', '1' or 'graphs', got 'on'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        for value in ("1", None):  # set, and the default
            if value is None:
                monkeypatch.delenv("BLOCKBATCH_CUDA_BATCHING")
            else:
                monkeypatch.setenv("BLOCKBATCH_CUDA_BATCHING", value)
            assert main(["serve", "--device", "cuda"]) == 2
            assert "device='cuda' but no CUDA device is available" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["serve", "--device", "tpu"])
    assert e.value.code == 2 and "argument --device: invalid choice: 'tpu'" in capsys.readouterr().err
