"""Short table of a gpu_check.sh run: test counts and failures, step latencies, decode checks.

    python benchmarks/gpu_summary.py DIR

DIR is the folder gpu_check.sh wrote (gpu_tests.xml, ops_tests.xml, bench_gpu_step.json,
gpu_decode_check.json, the CUDA scheduler's cuda_batching_tests.xml and bench_batch_*.json, and for
the opt-in kernels candidate_tests*.xml (one per candidate), bench_gpu_candidates.json,
gpu_decode_candidates.json); missing files are reported as missing, not skipped silently.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

try:
    from blockbatch import settings
except ImportError:  # not installed, no PYTHONPATH: the table is a standalone file of the checkout
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "blockbatch_settings",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "blockbatch", "settings.py"),
    )
    settings = sys.modules["blockbatch_settings"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(settings)


def tests(path: str) -> list[str]:
    if not os.path.exists(path):
        return [f"{os.path.basename(path)}: missing (the stage did not finish)"]
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    lines = [
        f"{os.path.basename(path)}: {n['tests'] - n['failures'] - n['errors'] - n['skipped']} passed, "
        f"{n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped"
    ]
    for case in suite.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            message = (bad.get("message") or "").splitlines()[0][:200] if bad.get("message") else ""
            lines.append(f"  FAILED {case.get('name')}: {message}")
    return lines


def fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v))


def steps(path: str) -> list[str]:
    if not os.path.exists(path):
        return [f"{os.path.basename(path)}: missing"]
    data = json.load(open(path))
    cols = (
        "native_eager_ms",
        "graph_replay_ms",
        "gpu_busy_ms",
        "plain_pytorch_ms",
        "roofline_ms",
        "replay_over_roofline",
        "replay_over_roofline_with_kv",
        "replay_over_busy",
        "plain_over_native",
        "attn_sync_ms_splits_auto",
        "attn_pipelined_ms_splits_auto",
        "attn_pipelined3_ms_splits_auto",
        "bookkeeping_ms",
    )
    if os.path.basename(path) == "bench_gpu_candidates.json":  # default vs each opt-in kernel, one process
        names = ("default", *settings.candidates())
        cols = tuple(f"{n}_{c}" for n in names for c in ("replay_ms", "busy_ms", "replay_over_busy"))
    lines = [
        f"bench_gpu_step ({data.get('device')}, torch {data.get('torch')}, {data.get('layers')} layers)",
        "step L " + " ".join(cols),
    ]
    for r in data["results"]:
        lines.append(f"{r['step']} {r['L']} " + " ".join(fmt(r.get(c)) for c in cols))
        lines += [f"  {k}: {v}" for k, v in r.items() if k.endswith("_error")]
        lines += [f"    {ms:8.3f} ms {n:4d}x {name[:70]}" for name, ms, n in r.get("top_kernels", [])[:6]]
    for key, r in data.get("gemm", {}).items():  # per weight shape and row count: cuBLAS
        lines += [f"  {k}: {v}" for k, v in r.items() if k.endswith("_error")]
        for name in ("qkv", "attn_out", "gate_up", "ff_out", "lm_head"):
            if f"{name}_cublas_us" in r:
                lines.append(
                    f"gemm {key} {name}: cuBLAS {r[f'{name}_cublas_us']:.1f} us "
                    f"({r[f'{name}_cublas_tb_per_s']:.2f} TB/s, {r[f'{name}_cublas_tflop_per_s']:.0f} TFLOP/s)"
                )
    return lines


# candidate -> the test names (substrings) that must pass before it may become the default
CANDIDATE_TESTS = settings.candidate_tests()


def candidate_test_files(d: str) -> list[str]:
    """The candidates' JUnit files: one per candidate process (candidate_tests_<name>.xml)."""
    return sorted(glob.glob(os.path.join(d, "candidate_tests*.xml")))


def verdicts(d: str, candidate_tests: dict | None = None) -> list[str]:
    """Per candidate (``candidate_tests``: {name: test-name substrings}, default the table's): did its
    GPU tests pass, and its graph replay against the default's, step by step (ratios from the one
    process that timed both)? Worth making the default when its tests pass, no step is more than 1%
    slower and one is at least 1% faster."""
    candidate_tests = CANDIDATE_TESTS if candidate_tests is None else candidate_tests
    if not candidate_tests:
        return ["verdicts: no kernel candidates left in the settings table (python/blockbatch/settings.py)"]
    tests_xml, bench = candidate_test_files(d), os.path.join(d, "bench_gpu_candidates.json")
    if not (tests_xml and os.path.exists(bench)):
        return ["verdicts: candidate_tests*.xml or bench_gpu_candidates.json missing"]
    failed = [
        case.get("name", "")
        for path in tests_xml
        for case in ET.parse(path).getroot().iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    results = json.load(open(bench))["results"]
    lines = ["verdicts (candidate replay / default replay per step; < 1 is faster):"]
    for name, needles in candidate_tests.items():

        def concerns(test: str) -> bool:  # a parametrized id naming another candidate is not this one's
            kinds = set(candidate_tests) & set(re.split(r"[\[\]-]", test))
            return any(n in test for n in needles) and (not kinds or name in kinds)

        bad = [f for f in failed if concerns(f)]
        ratios = {
            f"{r['step']} L{r['L']}": r[name + "_replay_ms"] / r["default_replay_ms"]
            for r in results
            if r.get(name + "_replay_ms") and r.get("default_replay_ms")
        }
        slower = [k for k, v in ratios.items() if v > 1.01]
        verdict = (
            "tests FAIL"
            if bad
            else "no timings"
            if not ratios
            else f"keep opt-in (slower at {', '.join(slower)})"
            if slower
            else "make the default"
            if min(ratios.values()) < 0.99
            else "no measurable gain"
        )
        lines.append(
            f"  {name}: {verdict}; "
            + "; ".join(f"{k}: {v:.3f}" for k, v in ratios.items())
            + (f"; failed: {', '.join(bad)}" if bad else "")
        )
    return lines


def decode(path: str) -> list[str]:
    if not os.path.exists(path):
        return [f"{os.path.basename(path)}: missing"]
    data = json.load(open(path))
    lines = [f"{os.path.basename(path)} (n={data['n']})"]
    for name, r in data["policies"].items():
        if "fp32_gpu_equals_cpu" not in r:  # the candidates' comparison
            lines.append(
                f"{name}: "
                + ", ".join(f"{k} {fmt(v)}" for k, v in r.items() if not isinstance(v, dict))
                + f", acc {json.dumps(r['accuracy'])}"
            )
            continue
        lines.append(
            f"{name}: fp32 gpu==cpu {r['fp32_gpu_equals_cpu']:.2f}, "
            f"graph==eager fp32 {r['fp32_graph_equals_eager']:.2f}"
            f" bf16 {r['bf16_graph_equals_eager']:.2f}, bf16~fp32 {r['bf16_vs_fp32_token_agreement']:.4f}, "
            f"acc {json.dumps(r['accuracy'])}, "
            f"median ms {json.dumps({k: round(v, 2) for k, v in r['median_ms'].items()})}"
        )
    lines += [f"{name}: ERROR {e}" for name, e in data.get("errors", {}).items()]
    return lines


def dream(path: str) -> list[str]:
    if not os.path.exists(path):
        return [f"{os.path.basename(path)}: missing"]
    data = json.load(open(path))
    lines = [f"{os.path.basename(path)} ({data['shape']}, {data['dtype']}, L {data['L']})"]
    for fam, r in data["models"].items():
        lines.append(
            f"{fam}: BlockBatch step ({r['bb_step_query_tokens']} tokens) {r['bb_step_ms']:.2f} ms, "
            f"dual 32-token step {r['dual_step_ms']:.2f} ms, full forward {r['full_forward_ms']:.2f} ms"
        )
        for name, d in r.get("decode", {}).items():
            lines.append(
                f"  decode {name}: {d['median_ms']:.1f} ms, NFE {d['nfe']}, {d['ms_per_forward']:.2f} ms/forward"
            )
    if "dream_over_llada" in data:
        lines.append("dream / llada: " + ", ".join(f"{k} {v:.3f}" for k, v in data["dream_over_llada"].items()))
    return lines


def batching(path: str) -> list[str]:
    """bench_batch.py's JSON: per policy and max_batch, throughput vs one by one and agreement with it."""
    if not os.path.exists(path):
        return [f"{os.path.basename(path)}: missing"]
    data = json.load(open(path))
    lines = [
        f"{os.path.basename(path)} ({data['model']}, {data.get('dtype')}, {data.get('device')}, "
        f"{data['n']} requests, gen {data['gen_length']}"
        + (f", BLOCKBATCH_CUDA_BATCHING={data['cuda_batching']}" if data.get("cuda_batching") else "")
        + (", BLOCKBATCH_BATCH_INVARIANT=1" if data.get("batch_invariant") else "")
        + ")"
    ]
    for policy, rows in data["policies"].items():
        one = rows["one_by_one"]
        floor = rows.get("compute_floor")
        lines.append(
            f"{policy}: one by one {one['tokens_per_s']:.0f} tok/s"
            + (f" (compute floor: at most {floor['speedup_bound']:.2f}x)" if floor else "")
        )
        for key, r in rows.items():
            if key.startswith("batch_"):
                lines.append(
                    f"  max_batch {key[6:]}: {r['tokens_per_s']:.0f} tok/s, "
                    f"{r['speedup_vs_one_by_one']:.2f}x one by one, p99 {r['p99_latency_ms']:.0f} ms, "
                    f"equal {r['equal_to_one_by_one']}, token agreement {r.get('token_agreement', 0):.4f}"
                    + (
                        f", graph replays {r['graph_replays']}/{r['padded_forwards']} padded"
                        if r.get("padded_forwards")
                        else ""
                    )
                )
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: gpu_summary.py DIR (the folder gpu_check.sh wrote)", file=sys.stderr)
        return 2
    d = argv[0]
    out = tests(os.path.join(d, "gpu_tests.xml")) + tests(os.path.join(d, "ops_tests.xml"))
    out += steps(os.path.join(d, "bench_gpu_step.json")) + decode(os.path.join(d, "gpu_decode_check.json"))
    out += dream(os.path.join(d, "bench_gpu_dream.json"))
    out += ["== the scheduler on CUDA (BLOCKBATCH_CUDA_BATCHING=graphs, the default; =1 eager steps)"]
    out += tests(os.path.join(d, "cuda_batching_tests.xml"))
    for name in (
        "bench_batch_toy_fp32.json",
        "bench_batch_toy_bf16.json",
        "bench_batch_toy_fp32_eager.json",
        "bench_batch_toy_bf16_invariant.json",
        "bench_batch_llada8b.json",
        "bench_batch_llada8b_eager.json",
        "bench_batch_llada8b_invariant.json",
    ):
        out += batching(os.path.join(d, name))
    out += ["== opt-in kernels (candidates)"]
    if CANDIDATE_TESTS:
        for path in candidate_test_files(d) or [os.path.join(d, "candidate_tests_*.xml")]:
            out += tests(path)
        out += steps(os.path.join(d, "bench_gpu_candidates.json"))
        out += decode(os.path.join(d, "gpu_decode_candidates.json"))
    elif os.path.exists(os.path.join(d, "bench_gpu_candidates.json")):  # the cuBLAS GEMM sweep alone
        out += steps(os.path.join(d, "bench_gpu_candidates.json"))
    out += verdicts(d)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
