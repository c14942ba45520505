"""``blockbatch tune`` (issue 22 items 1-2): the grid, the frontier and the choice, the step-time
model, and the sweep end to end on the toy model: scores equal direct decodes, the chosen
preset decodes as its config, resume / time budget / Ctrl-C lose nothing, answer-less tasks are
scored against the one-token-per-step reference."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import blockbatch
from blockbatch import DecodeOptions, bench, presets, steptime, tune
from blockbatch.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_JSON = os.path.join(REPO, "docs", "bench", "gpu", "bench_gpu_step.json")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(blockbatch.__file__)), os.environ.get("PYTHONPATH", "")]
    ),
}


# ----------------------------------------------------------------------------- pure parts


def _pt(acc, nfe, policy="dual"):
    return {"accuracy": acc, "mean_nfe": nfe, "policy": policy}


def test_frontier_keeps_exactly_the_undominated_points_by_cost():
    pts = {
        "a": _pt(0.9, 3.0),
        "b": _pt(0.8, 2.0),
        "c": _pt(0.85, 3.5),  # c: beaten by a
        "d": _pt(0.9, 3.0, "blockbatch"),
        "e": _pt(0.95, 5.0),
        "f": _pt(0.8, 2.5),
    }  # f: beaten by b
    assert tune.frontier(pts, "mean_nfe") == ["b", "a", "d", "e"]


def test_choose_takes_the_cheapest_within_max_drop_of_the_best_and_can_be_restricted_to_a_policy():
    pts = {
        "dual:x": _pt(0.95, 5.0),
        "dual:y": _pt(0.94, 3.0),
        "blockbatch:z": _pt(0.93, 2.0, "blockbatch"),
        "blockbatch:w": _pt(0.90, 1.5, "blockbatch"),
    }
    assert tune.choose(pts, "mean_nfe", 0.0) == "dual:x"
    assert tune.choose(pts, "mean_nfe", 0.01) == "dual:y"
    assert tune.choose(pts, "mean_nfe", 0.02) == "blockbatch:z"
    assert tune.choose(pts, "mean_nfe", 0.0, policy="blockbatch") == "blockbatch:z"  # its most accurate
    assert tune.choose(pts, "mean_nfe", 0.1, policy="blockbatch") == "blockbatch:w"
    assert tune.choose(pts, "mean_nfe", 0.0, policy="prefix") is None
    assert tune.choose({}, "mean_nfe", 0.0) is None
    # Equal accuracy and NFE (as the merge gates 0.5 and 0.9 often are): the fewer query tokens wins,
    # whatever the names' order.
    tied = {"blockbatch:a": _pt(0.98, 6.22, "blockbatch"), "blockbatch:b": _pt(0.98, 6.22, "blockbatch")}
    tied["blockbatch:a"]["mean_query_tokens"], tied["blockbatch:b"]["mean_query_tokens"] = 861, 696
    assert tune.choose(tied, "mean_nfe", 0.01) == "blockbatch:b"


def test_grid_configs_fit_gen_length_interleave_policies_and_are_valid_specs():
    grid = tune.Grid(
        policies=("dual", "blockbatch"),
        block_lengths=(16, 48, 64),
        thresholds=(0.9, 0.8),
        branch_sets=((4, 8, 16, 32, 64, 128), (8, 16, 32, 64)),
        merge_gates=(0.5,),
        refresh=("32", "block"),
        sync_refresh=(False,),
    )
    specs = tune.configs(grid, 64)
    assert len(specs) == len(set(specs))
    assert not any("block_length=48" in s for s in specs)  # 48 does not divide 64
    assert not any("128" in s for s in specs)  # 128 > gen_length: dropped from sets
    assert specs[0].startswith("dual:") and specs[1].startswith("blockbatch:")  # interleaved
    assert "blockbatch:block_sizes=4/8/16/32/64,threshold=0.9,merge_gate=0.5,refresh_tokens=4" in specs  # 'block'
    assert "blockbatch:block_sizes=8/16/32/64,threshold=0.8,merge_gate=0.5,refresh_tokens=32" in specs
    for s in specs:
        o = bench.policy_options(s, 64)  # every spec is a valid DecodeOptions
        assert o.gen_length == 64
    assert tune.configs(tune.Grid(policies=("dual",), block_lengths=(48,)), 64) == []
    with pytest.raises(ValueError, match="policies"):
        tune.configs(tune.Grid(policies=("fast",)), 64)


def test_step_time_fit_recovers_a_known_model_and_never_goes_negative():
    true = (2e-3, 1e-5, 3e-7, 4e-9)
    pts = [(q, L, true[0] + true[1] * q + true[2] * L + true[3] * q * L) for q in (8, 32, 128) for L in (128, 512)]
    m = steptime.fit(pts, "synthetic")
    for got, want in zip(m.coef, true):
        assert got == pytest.approx(want, rel=1e-6)
    # data that would need a negative coefficient: time falls with L
    m2 = steptime.fit([(8, 128, 2.0), (8, 512, 1.0), (64, 128, 3.0), (64, 512, 2.0)], "odd")
    assert min(m2.coef) >= 0
    assert m.decode_seconds([97, 32, 97], 97) == pytest.approx(sum(m.step_seconds(q, 97) for q in (97, 32, 97)))


def test_step_time_loads_the_gpu_step_benchmark_and_round_trips(tmp_path):
    m = steptime.load(GPU_JSON)
    assert "H200" in m.source
    for q, L, s in m.points:  # 4 points, 4 coefficients: fitted exactly
        assert m.step_seconds(q, L) == pytest.approx(s, rel=1e-6)
    assert m.step_seconds(252, 512) > m.step_seconds(32, 512) > 0
    path = tmp_path / "model.json"
    m.save(str(path))
    again = steptime.load(str(path))
    assert again.coef == pytest.approx(m.coef) and again.source == m.source
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": 3}')
    with pytest.raises(ValueError, match="bad.json"):
        steptime.load(str(bad))
    with pytest.raises(ValueError, match="step-time file .*missing.json: file not found"):
        steptime.load(str(tmp_path / "missing.json"))


def test_step_time_measured_on_the_toy_is_increasing_in_tokens():
    from blockbatch import Engine

    m = steptime.measure(Engine.from_pretrained().model, tokens=(8, 64), lengths=(64, 128), repeats=3)
    # L 64: q 8 and the full forward (q = L = 64); L 128: q 8, 64 and the full forward
    assert sorted((q, L) for q, L, _ in m.points) == [(8, 64), (8, 128), (64, 64), (64, 128), (128, 128)]
    assert all(s > 0 for _, _, s in m.points)
    assert m.step_seconds(128, 128) > m.step_seconds(8, 128) > 0
    assert "measured" in m.source


# ----------------------------------------------------------------------------- the sweep

SMALL = [
    "--n",
    "6",
    "--gen-length",
    "64",
    "--policies",
    "dual,blockbatch",
    "--block-lengths",
    "32,64",
    "--thresholds",
    "0.9",
    "--branch-sets",
    "32/64",
    "--merge-gates",
    "0.9",
    "--refresh",
    "32",
    "--sync-refresh",
    "on",
    "--step-time",
    GPU_JSON,
    "--quiet",
]


def test_tune_end_to_end_scores_equal_direct_decodes_and_the_preset_decodes_as_its_config(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["tune", "--out", str(out), *SMALL]) == 0
    text = capsys.readouterr().out
    assert "frontier" in text and "chosen" in text
    data = json.loads((out / "tune.json").read_text())
    assert set(data["configs"]) == {
        "dual:block_length=32,threshold=0.9",
        "dual:block_length=64,threshold=0.9",
        "blockbatch:block_sizes=32/64,threshold=0.9,merge_gate=0.9,refresh_tokens=32,sync_refresh=true",
    }
    assert data["scored_by"] == "answers" and data["stopped"] is None and data["remaining"] == []
    assert (out / "tune_bench_gpu_step.png").stat().st_size > 10_000  # named after its time source

    from blockbatch import Engine

    engine = Engine.from_pretrained()
    samples = bench.load_tasks(None, 6)
    gpu = steptime.load(GPU_JSON)
    for spec, rec in data["configs"].items():
        o = bench.policy_options(spec, 64)
        gens = [engine.generate(s.prompt, o)[0] for s in samples]
        assert rec["correct"] == [bool(s.check(g)) for s, g in zip(samples, gens)]
        assert rec["nfe"] == [g.stats["nfe"] for g in gens]
        assert rec["accuracy"] == sum(rec["correct"]) / 6
        model_ms = [gpu.decode_seconds(g.stats["query_tokens_per_step"], len(g.prompt_ids) + 64) * 1e3 for g in gens]
        assert rec["mean_model_ms"] == pytest.approx(sum(model_ms) / 6)

    preset = presets.get(str(out / "preset.json"))
    chosen = json.loads((out / "preset.json").read_text())["evidence"]["config"]
    assert chosen == tune.choose(data["configs"], "mean_nfe", 0.01)
    want = bench.policy_options(chosen, 64)
    got = DecodeOptions.from_preset(str(out / "preset.json"), gen_length=64)
    assert got == want, (preset, chosen)


def test_tune_resumes_after_its_time_budget_and_refuses_another_setup(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["tune", "--out", str(out), "--time-budget", "1e-9", *SMALL]) == 0
    first = json.loads((out / "tune.json").read_text())
    assert first["stopped"] == "time budget" and len(first["configs"]) == 1 and len(first["remaining"]) == 2
    assert "rerun the same command" in capsys.readouterr().err
    assert main(["tune", "--out", str(out), *SMALL]) == 0
    second = json.loads((out / "tune.json").read_text())
    assert len(second["configs"]) == 3 and second["stopped"] is None
    done = next(iter(first["configs"]))
    assert second["configs"][done] == first["configs"][done]  # kept, not decoded again (wall times equal)
    assert main(["tune", "--out", str(out), *[a if a != "6" else "5" for a in SMALL]]) == 2
    assert "--fresh" in capsys.readouterr().err
    assert main(["tune", "--out", str(out), "--fresh", *[a if a != "6" else "5" for a in SMALL]]) == 0


def test_tune_without_answers_scores_agreement_with_the_one_token_per_step_decode(tmp_path):
    from blockbatch.toy import task

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": p.prompt}) + "\n" for p in task.make_problems(4, 0, "test")))
    out = tmp_path / "t"
    assert (
        main(
            [
                "tune",
                "--out",
                str(out),
                "--tasks",
                str(tasks),
                "--n",
                "4",
                "--gen-length",
                "64",
                "--policies",
                "vanilla,dual",
                "--block-lengths",
                "64",
                "--thresholds",
                "0.5",
                "--quiet",
            ]
        )
        == 0
    )
    data = json.loads((out / "tune.json").read_text())
    assert data["scored_by"] == "reference" and len(data["reference"]["ids"]) == 4
    assert data["configs"]["vanilla"]["accuracy"] == 1.0  # the reference agrees with itself
    assert 0.0 <= data["configs"]["dual:block_length=64,threshold=0.5"]["accuracy"] <= 1.0


def test_tune_user_errors_are_one_line(tmp_path, capsys):
    assert (
        main(
            [
                "tune",
                "--out",
                str(tmp_path / "t"),
                "--gen-length",
                "24",
                "--block-lengths",
                "64",
                "--policies",
                "dual",
                "--quiet",
            ]
        )
        == 2
    )
    assert "no config for --gen-length 24" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse's own errors
        main(["tune", "--out", str(tmp_path / "t"), "--branch-sets", "8/x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--branch-sets" in err and "'8/x'" in err and len(err.strip().splitlines()) == 1
    assert main(["tune", "--out", str(tmp_path / "t"), "--tasks", str(tmp_path / "none.jsonl"), "--quiet"]) == 2
    assert "none.jsonl" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_keeps_finished_configs_and_a_rerun_continues(tmp_path):
    out = tmp_path / "t"
    cmd = [
        sys.executable,
        "-m",
        "blockbatch.cli",
        "tune",
        "--out",
        str(out),
        "--n",
        "20",
        "--gen-length",
        "64",
        "--policies",
        "dual",
        "--block-lengths",
        "16,32,64",
        "--thresholds",
        "0.95,0.9,0.8,0.7,0.6",
        "--step-time",
        GPU_JSON,
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if (out / "tune.json").exists() and json.loads((out / "tune.json").read_text())["configs"]:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    data = json.loads((out / "tune.json").read_text())
    if proc.returncode == 130:
        assert data["stopped"] == "interrupted" and "rerun the same command" in err
    else:  # it finished before the signal landed
        assert proc.returncode == 0 and not data["remaining"]
    done = dict(data["configs"])
    rerun = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    final = json.loads((out / "tune.json").read_text())
    assert len(final["configs"]) == 15
    for k, v in done.items():
        assert final["configs"][k] == v


def test_blockbatch_best_is_the_config_the_shipped_sweeps_measured():
    """docs/tuning.md's frontier table quotes blockbatch-best from docs/bench/tune: the preset at
    gen_length 64 must be that very config, and that config must be on both toys' NFE frontier."""
    spec = "blockbatch:block_sizes=32/64,threshold=0.9,merge_gate=0.9,refresh_tokens=32,sync_refresh=true"
    assert DecodeOptions.from_preset("blockbatch-best", gen_length=64) == bench.policy_options(spec, 64)
    for family in ("llada", "dream"):
        data = json.loads(open(os.path.join(REPO, "docs", "bench", "tune", family, "tune.json")).read())
        pts = data["configs"]
        assert spec in tune.frontier(pts, "mean_nfe"), family
        dual = {n: p for n, p in pts.items() if p["policy"] == "dual"}
        best = pts[spec]
        assert not any(p["accuracy"] > best["accuracy"] and p["mean_nfe"] <= best["mean_nfe"] for p in dual.values())


def test_the_grid_of_policy_block_for_llada2():
    """LLaDA2's decoder in the grid: block lengths that need not divide gen_length (blocks aligned at
    0), each threshold with and without LLaDA2.1's editing, every spec a valid DecodeOptions."""
    from blockbatch.bench import policy_options
    from blockbatch.tune import Grid, configs

    specs = configs(Grid(policies=("block",), block_lengths=(16, 32), thresholds=(0.95, 0.7)), 40)
    assert len(specs) == 8 and specs[0] == "block:block_length=32,threshold=0.95"
    assert "block:block_length=16,threshold=0.7,edit_threshold=0.5" in specs
    for spec in specs:
        o = policy_options(spec, 40)
        assert o.policy == "block" and o.gen_length == 40


def test_the_grid_of_policy_wavefront():
    """FlowBlock's wavefront in the grid: max_active_blocks x spawn_threshold x threshold (the gate once
    for one block, which never reads it), LLaDA2.1's block 32 and edit_threshold 0.5 throughout; two
    blocks, gate 0.5, threshold 0.7 first; every spec a valid DecodeOptions."""
    from blockbatch.bench import policy_options
    from blockbatch.tune import Grid, configs

    grid = Grid(policies=("wavefront",), thresholds=(0.95, 0.7), max_active_blocks=(1, 2, 4))
    specs = configs(grid, 64)
    assert len(specs) == 2 + 2 * 3 * 2
    assert (
        specs[0] == "wavefront:block_length=32,edit_threshold=0.5,threshold=0.7,max_active_blocks=2,spawn_threshold=0.5"
    )
    seen = set()
    for spec in specs:
        o = policy_options(spec, 64)
        assert o.policy == "wavefront" and o.edit_threshold == 0.5 and o.gen_length == 64
        seen.add((o.max_active_blocks, o.spawn_threshold, o.threshold))
    assert len(seen) == len(specs) and {m for m, _, _ in seen} == {1, 2, 4}


def test_the_grid_of_policy_block_for_sdar():
    """SDAR's family grid (families/sdar.py TUNE_GRID): each unmasking rule x block length, dynamic x each
    threshold too; the authors' dynamic at 0.85 with blocks of 4 first; no token editing (LLaDA2.1's)."""
    import dataclasses

    from blockbatch import families
    from blockbatch.bench import policy_options
    from blockbatch.tune import Grid, configs

    grid = dataclasses.replace(
        Grid(policies=("block",), block_lengths=(4, 8), thresholds=(0.85, 0.6)), **families.get("sdar").TUNE_GRID
    )
    specs = configs(grid, 40)
    assert len(specs) == 2 * 2 + 3 * 2 and specs[0] == "block:block_length=4,unmasking=dynamic,threshold=0.85"
    assert "block:block_length=8,unmasking=entropy_bounded" in specs
    assert not any("edit_threshold" in s for s in specs)
    for spec in specs:
        o = policy_options(spec, 40)
        assert o.policy == "block" and o.unmasking in ("dynamic", "static", "sequential", "entropy_bounded")


def test_a_window_grid_on_dream_keeps_the_configs_it_cannot_run_apart(tmp_path, capsys):
    """`tune --policies window` on the Dream toy: a config whose sliding span passes its kept prefix (the
    authors' code cannot run it) is refused by the engine; the sweep says so, keeps the reason under
    `refused`, and goes on with the others (scored as usual)."""
    from blockbatch.toy import checkpoint_path

    out = tmp_path / "t"
    args = ["tune", "--model", checkpoint_path("dream"), "--out", str(out), "--n", "4", "--gen-length", "64"]
    grid = ["--policies", "window", "--refresh-intervals", "16", "--active-tokens", "4", "--window-tokens", "8,127"]
    assert main([*args, *grid, "--quiet"]) == 0
    data = json.loads((out / "tune.json").read_text())
    small, large = (f"window:steps=64,refresh_interval=16,active_tokens=4,window_tokens={w}" for w in (8, 127))
    assert list(data["refused"]) == [small] and "window_tokens" in data["refused"][small]
    assert list(data["configs"]) == [large] and data["remaining"] == []
    assert f"{small}: refused (window_tokens)" in capsys.readouterr().err
