"""The one output-file rule (blockbatch.outputs, issue 51 items 1, 4, 7, 10): every command that
writes refuses, before the work, a path that is an input, a checkpoint file, the run's own state
or not a regular file; writes atomically, whole lines only; handles every terminating signal as
Ctrl-C; names the file in every error. Also: user regexes are time-bounded, non-finite answers
are refused at load, lm-eval task errors name the file. Real `blockbatch` subprocesses, real
files and real signals throughout (the toy model)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

import blockbatch
from blockbatch import errors, outputs, presets, tasks
from blockbatch.toy import checkpoint_path
from helpers.processes import interrupt_once_printed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPU_JSON = os.path.join(REPO, "docs", "bench", "gpu", "bench_gpu_step.json")
TASK_DIR = os.path.join(REPO, "tests", "lm_eval_task")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(blockbatch.__file__)), os.environ.get("PYTHONPATH", "")]
    ),
}
# A tiny sweep: 2 tasks, 2 configs, the GPU step-time file (no measuring).
TINY = ["--n", "2", "--gen-length", "32", "--policies", "dual", "--block-lengths", "32"]
TINY += ["--thresholds", "0.9,0.8", "--step-time", GPU_JSON, "--quiet"]
PROMPT = "72-2=__-3=__-3=__...............?"


def _cli(*args, preexec_fn=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        preexec_fn=preexec_fn,
    )


def _tasks_file(path, n=2):
    path.write_text("".join(json.dumps({"prompt": PROMPT, "answer": "64"}) + "\n" for _ in range(n)))
    return path


def _refused_fast(res, *names, before=None):
    """Status 2, one error line naming every one of ``names``, no traceback, no temp name."""
    assert res.returncode == 2, res.stdout + res.stderr
    err = res.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for name in names:
        assert str(name) in err, (name, err)
    assert ".tmp" not in err, err


# ----------------------------------------------------------------------------- tune --write-preset


def test_write_preset_refuses_an_input_of_the_run(tmp_path):
    """--write-preset onto the --tasks file (by name, or a symbolic or hard link to it) or the
    --step-time file: refused before the sweep (no tune.json), the file untouched."""
    src = _tasks_file(tmp_path / "tasks.jsonl")
    before = src.read_bytes()
    (tmp_path / "link.json").symlink_to(src)
    os.link(src, tmp_path / "hard.json")
    for target in (src, tmp_path / "link.json", tmp_path / "hard.json"):
        t0 = time.monotonic()
        res = _cli("tune", "--out", tmp_path / "o", "--tasks", src, *TINY, "--write-preset", target)
        _refused_fast(res, "--write-preset", target, "--tasks")
        assert time.monotonic() - t0 < 60
    assert src.read_bytes() == before and not (tmp_path / "o" / "tune.json").exists()
    step = tmp_path / "step.json"
    shutil.copy(GPU_JSON, step)
    res = _cli("tune", "--out", tmp_path / "o", *TINY, "--step-time", step, "--write-preset", step)
    _refused_fast(res, "--write-preset", "--step-time")


def test_write_preset_refuses_a_checkpoint_file(tmp_path):
    """--write-preset onto a model folder's config.json (or a link to it, or a new file in that
    folder): refused; the checkpoint still loads."""
    model = tmp_path / "model"
    shutil.copytree(checkpoint_path(), model)
    config = (model / "config.json").read_bytes()
    (tmp_path / "cfg.json").symlink_to(model / "config.json")
    for target in (model / "config.json", tmp_path / "cfg.json", model / "tokenizer.json", model / "new.json"):
        res = _cli("tune", "--model", model, "--out", tmp_path / "o", *TINY, "--write-preset", target)
        _refused_fast(res, "--write-preset", target, "model folder")
    assert (model / "config.json").read_bytes() == config and not (model / "new.json").exists()
    res = _cli("tune", "--model", model, "--out", model, *TINY)  # --out: OUT/tune.json would land in the checkpoint
    _refused_fast(res, "--out", "model folder")


def test_write_preset_refuses_the_runs_own_state(tmp_path):
    """--write-preset OUT/tune.json would replace the sweep it was chosen from: refused."""
    out = tmp_path / "o"
    res = _cli("tune", "--out", out, *TINY, "--write-preset", out / "tune.json")
    _refused_fast(res, "--write-preset", out / "tune.json", "--out")
    assert not (out / "tune.json").exists()


def test_output_rule_refuses_a_path_that_is_not_a_regular_file(tmp_path):
    """A FIFO, a device (/dev/full), a directory: refused before the sweep, never replaced."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, "/dev/full", tmp_path):
        res = _cli("tune", "--out", tmp_path / "o", *TINY, "--write-preset", target)
        _refused_fast(res, "--write-preset", target)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    with pytest.raises(outputs.OutputError, match="preset file .*fifo: is a FIFO"):
        presets.write(str(fifo), "x", {"policy": "dual"})
    with pytest.raises(outputs.OutputError, match="file .*fifo: is a FIFO"):
        errors.write_json_file(str(fifo), {})


def test_output_rule_refuses_a_missing_folder_before_the_work(tmp_path):
    """--write-preset missing/p.json fails at once (not after the sweep), naming the path, never a
    temporary name; write_json_file likewise."""
    t0 = time.monotonic()
    res = _cli("tune", "--out", tmp_path / "o", *TINY, "--write-preset", tmp_path / "missing" / "p.json")
    _refused_fast(res, "--write-preset", tmp_path / "missing" / "p.json", "does not exist")
    assert not (tmp_path / "o" / "tune.json").exists() and time.monotonic() - t0 < 60
    with pytest.raises(outputs.OutputError, match=r"missing/x\.json: .*does not exist") as e:
        errors.write_json_file(str(tmp_path / "missing" / "x.json"), {})
    assert ".tmp" not in str(e.value)


def test_output_rule_keeps_a_clean_write_clean(tmp_path):
    """A regular target: written whole, mode kept, through a symbolic link the file it names; no
    temporary left."""
    target = tmp_path / "p.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    (tmp_path / "link.json").symlink_to(target)
    presets.write(str(tmp_path / "link.json"), "mine", {"policy": "dual", "block_length": 32})
    assert presets.read(str(target)).options == {"policy": "dual", "block_length": 32}
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640 and (tmp_path / "link.json").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "p.json"]


# ----------------------------------------------------------------------------- generate --output


def test_generate_output_refuses_an_input_or_a_checkpoint_file(tmp_path):
    src = tmp_path / "req.jsonl"
    src.write_text(json.dumps({"prompt": PROMPT}) + "\n")
    preset = tmp_path / "p.json"
    presets.write(str(preset), "mine", {"policy": "dual", "block_length": 32})
    keep = preset.read_bytes()
    res = _cli("generate", "--input", src, "--preset", preset, "--output", preset)
    _refused_fast(res, "--output", preset, "--preset")
    assert preset.read_bytes() == keep
    model = tmp_path / "model"
    shutil.copytree(checkpoint_path(), model)
    res = _cli("generate", "--model", model, "--input", src, "--output", model / "config.json")
    _refused_fast(res, "--output", model / "config.json", "model folder")
    res = _cli("generate", "--input", src, "--output", tmp_path / "nope" / "out.jsonl")
    _refused_fast(res, "--output", tmp_path / "nope" / "out.jsonl", "does not exist")


def _slow_generate(tmp_path, n=400, preexec_fn=None):
    src, out = tmp_path / "req.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(f'{{"id": {i}, "ids": [1, 2, {3 + i % 20}]}}\n' for i in range(n)))
    out.write_text("old\n")
    cmd = [sys.executable, "-u", "-m", "blockbatch.cli", "generate", "--input", str(src), "--output", str(out)]
    cmd += ["--policy", "vanilla", "--gen-length", "64", "--block-length", "64", "--threshold", "none"]
    cmd += ["--steps", "64"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, preexec_fn=preexec_fn
    )
    return proc, out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_terminating_signal_keeps_the_lines_written(tmp_path, signum):
    """SIGTERM / SIGHUP during generate --output act as Ctrl-C: the lines written replace the old
    --output, status 128 + signal, no temporary left."""
    proc, out = _slow_generate(tmp_path)
    seen, err = interrupt_once_printed(proc, "2 done", signum=signum)
    assert proc.returncode == 128 + signum, seen + err
    assert "Traceback" not in err and "interrupted:" in err and signal.Signals(signum).name in err, err
    written = int(err.split("interrupted: ")[1].split()[0])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 2 <= len(rows) == written < 400 and all("ids" in r for r in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "req.jsonl"]


def test_sigkill_leaves_no_temporary(tmp_path):
    """SIGKILL cannot be handled: the old --output stays as it was, and no temporary is left
    (an unnamed O_TMPFILE file)."""
    proc, out = _slow_generate(tmp_path)
    seen = ""
    try:
        while "2 done" not in seen and proc.poll() is None:
            seen += proc.stderr.read(1)
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "req.jsonl"]


def _file_size_limit(limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # past it: EFBIG (SIGXFSZ ignored)

    return set_limit


def test_full_disk_keeps_whole_lines_and_names_the_file(tmp_path):
    """A write that fails mid-line (here: the file size limit, as a full disk does): the error
    names --output, a cut line never lands, the whole lines before it are kept, no temporary."""
    src = tmp_path / "req.jsonl"
    src.write_text("".join(f'{{"id": {i}, "ids": [1, 2, {3 + i}]}}\n' for i in range(12)))
    out = tmp_path / "out.jsonl"
    res = _cli("generate", "--input", src, "--output", out, "--gen-length", "32", preexec_fn=_file_size_limit(700))
    assert res.returncode == 2 and f"--output {out}: cannot write it (file too large" in res.stderr, res.stderr
    kept = int(res.stderr.split("the ")[-1].split()[0])
    text = out.read_text()
    assert text.endswith("\n") and len(text) <= 700
    rows = [json.loads(line) for line in text.splitlines()]  # every line whole
    assert 0 < len(rows) == kept < 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "req.jsonl"]


def test_full_disk_in_tune_names_the_file_not_a_temporary(tmp_path):
    """tune's OUT/tune.json past the file size limit: the error names it; nothing half written."""
    out = tmp_path / "o"
    res = _cli("tune", "--out", out, *TINY, preexec_fn=_file_size_limit(1000))
    _refused_fast(res, f"--out {out / 'tune.json'}: cannot write it")
    assert sorted(os.listdir(out)) == []


# ----------------------------------------------------------------------------- tune cut short


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_partial_sweep_never_replaces_a_complete_preset(tmp_path, signum):
    """A complete sweep writes its preset; a second, longer sweep stopped after some configs (Ctrl-C
    or SIGTERM) writes no preset: the complete one stays byte for byte, stderr says N of M done."""
    preset = tmp_path / "best.json"
    res = _cli("tune", "--out", tmp_path / "a", *TINY, "--write-preset", preset)
    assert res.returncode == 0 and preset.exists(), res.stderr
    complete = preset.read_bytes()
    out = tmp_path / "b"
    cmd = [sys.executable, "-m", "blockbatch.cli", "tune", "--out", str(out), *TINY, "--write-preset", str(preset)]
    cmd[cmd.index("0.9,0.8")] = "0.95,0.9,0.85,0.8,0.75,0.7,0.65,0.6,0.55,0.5,0.45,0.4"
    cmd[cmd.index("--n") + 1] = "6"
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if json.loads((out / "tune.json").read_text())["configs"]:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    data = json.loads((out / "tune.json").read_text())
    if data["remaining"]:
        assert proc.returncode == 128 + signum, err
        assert "no preset written from a partial sweep" in err and "of 12 configs done" in err, err
        assert preset.read_bytes() == complete
    else:  # it finished before the signal landed
        assert proc.returncode == 0


def test_time_budget_writes_no_preset_from_a_partial_sweep(tmp_path):
    res = _cli("tune", "--out", tmp_path / "o", *TINY, "--time-budget", "1e-9")
    assert res.returncode == 0, res.stderr
    assert "time budget: 1 of 2 configs done" in res.stderr and "no preset written" in res.stderr
    assert not (tmp_path / "o" / "preset.json").exists()
    res = _cli("tune", "--out", tmp_path / "o", *TINY)  # the rerun finishes it and chooses
    assert res.returncode == 0 and (tmp_path / "o" / "preset.json").exists(), res.stderr


# ----------------------------------------------------------------------------- user regexes, answers


def test_catastrophic_answer_regex_is_bounded():
    """'(.+)+!' on a long generation backtracks for minutes: the check stops within the bound
    with an error naming --answer-regex."""
    check = tasks.AnswerCheck("regex", "(.+)+!")
    t0 = time.monotonic()
    with pytest.raises(tasks.RegexTimeout, match=r"--answer-regex '\(\.\+\)\+!'"):
        check.matches("a" * 5000, "x")
    assert time.monotonic() - t0 < tasks.REGEX_SECONDS + 2
    assert tasks.AnswerCheck("regex", r"answer (\d+)").matches("so the answer 64", "64")  # clean stays clean


def test_catastrophic_answer_regex_stops_the_sweep_with_an_error(tmp_path):
    """Through tune: the pattern on the toy's generations stays fast, the same pattern on a long
    answer line never stalls the process."""
    code = (
        "import time; from blockbatch import tasks\n"
        "c = tasks.AnswerCheck('regex', '(.+)+!')\n"
        "t = time.monotonic()\n"
        "try:\n    c.matches('x' * 100000, 'x')\nexcept ValueError as e:\n    print(time.monotonic() - t, e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENV)
    took = float(res.stdout.split()[0])
    assert took < tasks.REGEX_SECONDS + 2 and "--answer-regex" in res.stdout, res.stdout + res.stderr


def test_non_finite_answer_is_refused_at_load(tmp_path):
    """1e400 (parsed as inf), NaN and Infinity literals, and a last-number answer "Infinity": no
    generation could match; refused naming the file and the line."""
    for i, answer in enumerate(["1e400", "-1e400", "NaN", "Infinity"]):
        f = tmp_path / f"t{i}.jsonl"
        f.write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n" + f'{{"prompt": "b", "answer": {answer}}}\n')
        with pytest.raises(ValueError, match=rf"{f}:2: \"answer\" is not a finite number"):
            tasks.load_jsonl(str(f), 5)
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps({"prompt": "a", "answer": "Infinity"}) + "\n")
    with pytest.raises(ValueError, match=rf"{f}:1: .*not a finite number"):
        tasks.load_jsonl(str(f), 5, tasks.AnswerCheck("last-number"))
    res = _cli("tune", "--out", tmp_path / "o", "--tasks", tmp_path / "t0.jsonl", *TINY)
    _refused_fast(res, f"{tmp_path / 't0.jsonl'}:2")


def test_last_number_compares_long_numbers_exactly():
    """Decimal's normalize() rounded to 28 digits: two 34-digit numbers compared equal."""
    check = tasks.AnswerCheck("last-number")
    assert not check.matches("1234567890123456789012345678901234", "1234567890123456789012345678901235")
    assert check.matches("= 2.50", "2.5") and check.matches("1,234", "1234")


def test_an_integer_answer_past_the_digit_limit_names_the_line(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "a", "answer": ' + "9" * 5000 + "}\n")
    with pytest.raises(ValueError, match=rf"{f}:1: not a JSON object"):
        tasks.load_jsonl(str(f), 5)


# ----------------------------------------------------------------------------- lm-eval errors


def test_lm_eval_missing_include_path_says_so(tmp_path):
    pytest.importorskip("lm_eval")
    with pytest.raises(ValueError, match=rf"--include-path {tmp_path / 'nope'}: no such folder"):
        tasks.load_lm_eval("x", 3, include_path=str(tmp_path / "nope"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="--include-path .*file: not a folder"):
        tasks.load_lm_eval("x", 3, include_path=str(tmp_path / "file"))


@pytest.mark.slow
def test_lm_eval_yaml_error_and_empty_data_name_the_file(tmp_path):
    """A task YAML that does not parse: named with the problem and its line (not "knows no such
    task"); a task whose data file is empty: "holds no documents" (not "StopIteration: ")."""
    pytest.importorskip("lm_eval")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "mine.yaml").write_text('task: mine\noutput_type: generate_until\ndoc_to_text: "{{prompt}}\n  x: [\n')
    with pytest.raises(ValueError, match=rf"{bad / 'mine.yaml'}: not valid YAML \(.* at line \d+"):
        tasks.load_lm_eval("mine", 3, include_path=str(bad))
    empty = tmp_path / "empty"
    shutil.copytree(TASK_DIR, empty)
    (empty / "toy_arith.jsonl").write_text("")
    yaml = (empty / "toy_arith.yaml").read_text().replace("blockbatch_toy_arith", "empty_arith")
    (empty / "toy_arith.yaml").write_text(yaml)
    with pytest.raises(ValueError, match="--lm-eval-task empty_arith: its data holds no documents"):
        tasks.load_lm_eval("empty_arith", 3, include_path=str(empty))


# ----------------------------------------------------------------------------- bench, toy evaluate


def test_bench_out_and_evaluate_json_follow_the_rule(tmp_path):
    src = _tasks_file(tmp_path / "tasks.jsonl")
    out = tmp_path / "o"
    out.mkdir()
    (out / "bench.json").symlink_to(src)
    res = _cli("bench", "--out", out, "--tasks", src, "--n", "2", "--gen-length", "32", "--policies", "dual")
    _refused_fast(res, "--out", "bench.json", "--tasks")
    cfg = os.path.join(checkpoint_path(), "config.json")
    res = subprocess.run(
        [sys.executable, "-m", "blockbatch.toy.evaluate", "--n", "1", "--json", cfg],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert res.returncode == 2 and "--json" in res.stderr and "checkpoint folder" in res.stderr, res.stderr


def test_signal_exit_status_is_128_plus_the_signal():
    with pytest.raises(KeyboardInterrupt), outputs.signals_as_interrupt() as guard:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    assert guard.signum == signal.SIGUSR1 and guard.exit_status == 128 + signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the previous handler back


def test_named_temporary_fallback_sweeps_stale_temporaries_of_dead_processes(tmp_path, monkeypatch):
    """Where O_TMPFILE is not available a named temporary is used: one left by a process that
    died (SIGKILL) is swept by the next write; one of a live process is left alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".p.json.blockbatch-{dead.pid}-0a1b2c3d.tmp"
    live = tmp_path / f".p.json.blockbatch-{os.getppid()}-0a1b2c3d.tmp"
    stale.write_text("half")
    live.write_text("busy")
    monkeypatch.setattr(outputs.AtomicFile, "_open_unnamed", staticmethod(lambda folder, mode: None))
    errors.write_json_file(str(tmp_path / "p.json"), {"a": 1})
    assert json.loads((tmp_path / "p.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "p.json"])
