"""benchmarks/gpu_summary.py's candidate verdicts on synthetic gpu_check.sh output (no GPU needed)."""

import importlib.util
import json
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_summary", ROOT / "benchmarks" / "gpu_summary.py")
gpu_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_summary)

GEMM_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.test_cuda" name="test_stream_linear_error_within_2x_cublas[1-64-32-dtype0-staged]">
<failure message="assert 0.5 &lt;= 0.1">x</failure></testcase>
<testcase classname="tests.test_cuda" name="test_stream_linear_error_within_2x_cublas[1-64-32-dtype0-stream]"/>
</testsuite></testsuites>"""
PDL_XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="1">
<testcase classname="tests.test_cuda" name="test_pdl_variable_is_checked"/>
</testsuite></testsuites>"""


def test_verdicts(tmp_path):
    """gpu_check.sh runs each candidate's tests in a process of its own: the verdicts read every file."""
    (tmp_path / "candidate_tests_gemm.xml").write_text(GEMM_XML)
    (tmp_path / "candidate_tests_pdl.xml").write_text(PDL_XML)
    step = {
        "step": "single-32",
        "L": 512,
        "default_replay_ms": 5.0,
        "stream_replay_ms": 4.5,
        "staged_replay_ms": 4.0,
        "rope_vec_replay_ms": 5.02,
        "pdl_replay_ms": 5.2,
    }
    big = {"step": "blockbatch-6", "L": 512, "default_replay_ms": 8.0, "rope_vec_replay_ms": 7.9, "pdl_replay_ms": 7.0}
    (tmp_path / "bench_gpu_candidates.json").write_text(json.dumps({"results": [step, big]}))
    tests = {
        "stream": ("stream_linear",),
        "staged": ("stream_linear",),
        "rope_vec": ("rope_kv_write_cuda",),
        "pdl": ("pdl_variable",),
    }  # a table of four candidates (the verdicts read any)
    lines = {line.split(":")[0].strip(): line for line in gpu_summary.verdicts(str(tmp_path), tests)[1:]}
    assert "make the default" in lines["stream"] and "single-32 L512: 0.900" in lines["stream"]
    assert "tests FAIL" in lines["staged"] and "dtype0-staged" in lines["staged"]  # the stream id is not its failure
    assert "make the default" in lines["rope_vec"]  # 1.004 is within 1%, 0.988 a gain
    assert "keep opt-in (slower at single-32 L512)" in lines["pdl"]


def test_verdicts_without_files(tmp_path):
    assert gpu_summary.verdicts(str(tmp_path), {"pdl": ("pdl_variable",)}) == [
        "verdicts: candidate_tests*.xml or bench_gpu_candidates.json missing"
    ]


def test_verdicts_without_candidates(tmp_path, capsys, monkeypatch):
    """A table with no kernel candidates left (today's): the summary says so and does not crash."""
    assert gpu_summary.verdicts(str(tmp_path), {}) == [
        "verdicts: no kernel candidates left in the settings table (python/blockbatch/settings.py)"
    ]
    monkeypatch.setattr(gpu_summary, "CANDIDATE_TESTS", {})
    assert gpu_summary.main([str(tmp_path)]) == 0
    assert "verdicts: no kernel candidates left" in capsys.readouterr().out


def test_summary_lists_each_candidate_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_summary, "CANDIDATE_TESTS", {"stream": ("stream_linear",), "pdl": ("pdl_variable",)})
    (tmp_path / "candidate_tests_gemm.xml").write_text(GEMM_XML)
    (tmp_path / "candidate_tests_pdl.xml").write_text(PDL_XML)
    assert gpu_summary.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "candidate_tests_gemm.xml: " in out and "candidate_tests_pdl.xml: 1 passed, 0 failed" in out
    assert "FAILED test_stream_linear_error_within_2x_cublas[1-64-32-dtype0-staged]" in out


def test_dream_benchmark_smoke_run_and_summary(tmp_path):
    """bench_gpu_dream.py at its tiny shape on the CPU writes the JSON and PNG gpu_summary reads."""
    import subprocess
    import sys

    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_gpu_dream.py"),
            "--out",
            str(tmp_path),
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--gen-length",
            "64",
            "--decodes",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "bench_gpu_dream.json").read_text())
    assert (
        data["models"]["dream"]["bb_step_query_tokens"] == 124
        and data["models"]["llada"]["bb_step_query_tokens"] == 252
    )
    assert {"dual", "blockbatch"} <= data["models"]["dream"]["decode"].keys()
    assert (tmp_path / "bench_gpu_dream.png").stat().st_size > 0
    lines = gpu_summary.dream(str(tmp_path / "bench_gpu_dream.json"))
    assert lines[1].startswith("dream: BlockBatch step (124 tokens)") and lines[-1].startswith("dream / llada:")


def test_batch_benchmark_smoke_run_and_summary(tmp_path):
    """bench_batch.py on the CPU (LLaDA-8B's tiny twin built in memory, as llada-8b is on the GPU)
    writes the JSON gpu_summary's batching section reads."""
    import subprocess
    import sys

    out = tmp_path / "bench_batch_llada8b.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_batch.py"),
            "--model",
            "llada-tiny",
            "--n",
            "3",
            "--batches",
            "1,3",
            "--policies",
            "dual",
            "--gen-length",
            "32",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert data["model"] == "random-llada-tiny" and data["dtype"] == "float32" and data["device"] == "cpu"
    dual = data["policies"]["dual"]
    assert dual["batch_3"]["token_agreement"] == 1.0  # float32 CPU: batch invariant
    # max_batch 1 runs through the scheduler too: its own counters, one packed forward per forward
    assert dual["batch_1"]["packed_forwards"] == dual["batch_1"]["request_forwards"] == dual["one_by_one"]["forwards"]
    assert dual["batch_3"]["packed_forwards"] < dual["batch_3"]["request_forwards"]
    floor = dual["compute_floor"]
    assert floor["query_tokens"] >= 3 * 32 and floor["seconds"] == floor["query_tokens"] * floor["seconds_per_token"]
    assert floor["speedup_bound"] == dual["one_by_one"]["seconds"] / floor["seconds"]
    assert data["environment"]["torch"] == torch.__version__ and "bench_batch.py" in data["command"]
    lines = gpu_summary.batching(str(out))
    assert lines[0].startswith("bench_batch_llada8b.json (random-llada-tiny, float32, cpu, 3 requests, gen 32)")
    assert lines[2].startswith("  max_batch 1: ") and "equal 3/3, token agreement 1.0000" in lines[3]
