"""Tuning on a user's own task (issue 36 item 1): task files with token-id prompts, answer checks
(exact, last number, a regular expression's capture), an lm-evaluation-harness task's prompts,
filter and metric, the dev / test split and a preset that records what it was measured on."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from blockbatch import bench, presets, tasks
from blockbatch.cli import main
from blockbatch.toy import task as toy_task
from helpers.checkpoints import templated_toy_checkpoint

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # no hub access: the local lm-eval task only
os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval)")

TASK_DIR = Path(__file__).resolve().parents[1] / "lm_eval_task"
REPO = Path(__file__).resolve().parents[2]
GPU_JSON = str(REPO / "docs" / "bench" / "gpu" / "bench_gpu_step.json")


def _g(text: str = "", ids=()):
    return SimpleNamespace(text=text, ids=list(ids))


# ----------------------------------------------------------------------------- answer checks


def test_exact_check_compares_stripped_texts():
    c = tasks.AnswerCheck()
    assert c.matches("  64 \n", "64") and not c.matches("64;64", "64")


@pytest.mark.parametrize(
    "text, answer, want",
    [
        ("70 then 67 then 64", "64", True),
        ("... = 9 ; answer 9", "9", True),
        ("the total is -3.", "-3", True),
        ("costs 1,234 dollars", "1234", True),
        ("2.50", "2.5", True),
        ("2.50", 2.5, True),
        ("64 then 65", "64", False),  # the last number counts
        ("no number here", "0", False),
    ],
)
def test_last_number_check(text, answer, want):
    assert tasks.AnswerCheck("last-number").matches(text, str(answer)) is want


def test_regex_check_takes_the_last_match_and_its_first_group():
    c = tasks.AnswerCheck("regex", r"answer:? *(-?\d+)")
    assert c.matches("answer 3 ... wait, answer: 9", "9")
    assert not c.matches("answer 3 ... wait, answer: 9", "3")  # the last match wins
    assert not c.matches("no answer given", "9")
    whole = tasks.AnswerCheck("regex", r";\d+$")  # no group: the whole match
    assert whole.extract("72-2=70;70") == ";70"
    assert tasks.AnswerCheck("regex", r"=(\d+)?x").extract("=x") is None  # the group did not take part


def test_answer_check_errors_name_the_flag():
    with pytest.raises(ValueError, match="--answer-regex '\\(unclosed': not a valid regular expression"):
        tasks.AnswerCheck("regex", "(unclosed")
    with pytest.raises(ValueError, match="--answer 'fuzzy'"):
        tasks.AnswerCheck("fuzzy")


# ----------------------------------------------------------------------------- task files


def test_task_file_takes_ids_lines_and_token_id_answers(tmp_path):
    f = tmp_path / "t.jsonl"
    rows = [
        {"prompt": "a", "answer": "x"},
        {"ids": [1, 2, 3], "answer": [4, 5]},
        {"ids": [7], "answer": 12},
        {"prompt": "no answer"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ts = tasks.load_jsonl(str(f), 10, answers_optional=True)
    assert [s.prompt for s in ts.samples] == ["a", [1, 2, 3], [7], "no answer"]
    assert ts.available == 4 and ts.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    a, b, c, d = ts.samples
    assert a.check(_g(" x ")) == 1.0 and a.check(_g("y")) == 0.0
    assert b.check(_g("", [4, 5])) == 1.0 and b.check(_g("", [4, 5, 6])) == 0.0
    assert c.check(_g("12")) == 1.0 and c.answer == "12"
    assert d.check is None
    assert len(tasks.load_jsonl(str(f), 2).samples) == 2  # the first n; the rest counted, not parsed
    assert tasks.load_jsonl(str(f), 2).available == 4


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a", "ids": [1], "answer": 1}', 'exactly one of "prompt" (text) and "ids"'),
        ('{"ids": [1, "x"], "answer": 1}', '"ids" [1] must be a non-negative integer token id'),
        ('{"ids": [], "answer": 1}', '"ids" must hold at least one token id'),
        ('{"prompt": "", "answer": 1}', '"prompt" must be a non-empty string'),
        ('{"prompt": "a", "answer": {"x": 1}}', '"answer" must be a string, a number or a list of token ids'),
        ('{"prompt": "a"}', 'no "answer"'),
        ("[1, 2]", "expected a JSON object"),
        ("{oops", "not a JSON object"),
    ],
)
def test_task_file_errors_name_file_line_and_key(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "fine", "answer": "1"}\n' + line + "\n")
    with pytest.raises(ValueError) as e:
        tasks.load_jsonl(str(f), 5)
    assert f"{f}:2: " in str(e.value) and message in str(e.value)


def test_last_number_needs_numeric_answers_and_ids_answers_need_the_exact_check(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "a", "answer": "nine"}\n')
    with pytest.raises(ValueError, match=":1: \"answer\" 'nine' is not a number"):
        tasks.load_jsonl(str(f), 5, tasks.AnswerCheck("last-number"))
    f.write_text('{"prompt": "a", "answer": [1, 2]}\n')
    with pytest.raises(ValueError, match="only the exact check compares"):
        tasks.load_jsonl(str(f), 5, tasks.AnswerCheck("regex", "x"))


def test_bench_load_tasks_is_the_same_loader(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"ids": [3, 4], "answer": "z"}\n')
    [s] = bench.load_tasks(str(f), 3)
    assert s.prompt == [3, 4] and s.check(_g("z")) == 1.0


# ----------------------------------------------------------------------------- lm-eval tasks


def _toy_rows():
    with open(TASK_DIR / "toy_arith.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_lm_eval_task_gives_the_harness_prompts_and_scores_by_its_metric():
    ts = tasks.load_lm_eval("blockbatch_toy_arith", 5, include_path=str(TASK_DIR))
    rows = _toy_rows()[:5]
    assert [s.prompt for s in ts.samples] == [r["prompt"] for r in rows]
    assert ts.source == "lm-eval:blockbatch_toy_arith" and "exact_match" in ts.scored_by
    s, r = ts.samples[0], rows[0]
    assert s.check(_g(r["response"])) == 1.0
    assert s.check(_g(r["response"] + "\nmore text after the stop string")) == 1.0  # cut at until "\n"
    assert s.check(_g(r["response"][:-1])) == 0.0
    assert tasks.load_lm_eval("blockbatch_toy_arith", 5, include_path=str(TASK_DIR)).sha256 == ts.sha256


def test_lm_eval_task_errors_name_the_flag():
    with pytest.raises(ValueError, match="--lm-eval-task 'no_such_task_xyz': lm-eval knows no such task"):
        tasks.load_lm_eval("no_such_task_xyz", 3, include_path=str(TASK_DIR))
    with pytest.raises(ValueError, match="--lm-eval-metric 'bleu': task blockbatch_toy_arith reports exact_match"):
        tasks.load_lm_eval("blockbatch_toy_arith", 3, include_path=str(TASK_DIR), metric="bleu")
    with pytest.raises(ValueError, match="--lm-eval-filter 'strict'"):
        tasks.load_lm_eval("blockbatch_toy_arith", 3, include_path=str(TASK_DIR), filter_name="strict")


def test_prompts_are_encoded_as_their_source_means_them(tmp_path):
    """On a checkpoint with a chat template: an lm-eval context is decoded as the harness model
    (blockbatch.lm_eval) feeds it, never through the template; a task file's text goes through the
    template unless encoded raw (tune --no-chat); token ids are taken as they are."""
    from blockbatch.engine import Engine
    from blockbatch.lm_eval import BlockBatchLM

    templated_toy_checkpoint(tmp_path / "ckpt")
    engine = Engine.from_pretrained(tmp_path / "ckpt")
    ts = tasks.load_lm_eval("blockbatch_toy_arith", 2, include_path=str(TASK_DIR))
    lm = BlockBatchLM(pretrained=str(tmp_path / "ckpt"), policy="dual", block_length=8, gen_length=16, device="cpu")
    for s in ts.samples:
        ids = tasks.encode(engine, s).tolist()
        assert ids == engine.codec.encode(s.prompt, chat=False, special_tokens=True)
        assert ids != engine.encode(s.prompt).tolist()  # the template would have changed the prompt
        request = SimpleNamespace(args=(s.prompt, {"until": []}))
        [text] = lm.generate_until([request], disable_tqdm=True)
        [direct] = engine.generate([ids], lm.options_for({})[0])
        assert text == direct.text  # the same decode as the harness model's
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "12+1=__", "answer": "13"}) + "\n")
    [chat] = tasks.load_jsonl(str(tmp_path / "t.jsonl"), 1).samples
    [raw] = tasks.load_jsonl(str(tmp_path / "t.jsonl"), 1, encoding="raw").samples
    assert tasks.encode(engine, chat).tolist() == engine.codec.encode("12+1=__")  # through the template
    assert tasks.encode(engine, raw).tolist() == engine.codec.encode("12+1=__", chat=False)
    assert tasks.encode(engine, chat).tolist() != tasks.encode(engine, raw).tolist()
    with pytest.raises(ValueError, match="Sample.encoding must be one of chat, raw, harness, got 'text'"):
        tasks.encode(engine, tasks.Sample("1", None, encoding="text"))


# ----------------------------------------------------------------------------- tune end to end

GRID = [
    "--gen-length",
    "64",
    "--policies",
    "dual",
    "--block-lengths",
    "32,64",
    "--thresholds",
    "0.9",
    "--step-time",
    GPU_JSON,
    "--quiet",
]


def _cot_file(path: Path, n: int) -> list:
    """The toy's problems, answers checked as chain-of-thought: only the number after ';' counts."""
    problems = toy_task.make_problems(n, 0, "test")
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems))
    return problems


def test_tune_on_a_cot_task_with_dev_and_test_scores_both_and_the_preset_records_them(tmp_path, capsys):
    from blockbatch import Engine

    f = tmp_path / "cot.jsonl"
    problems = _cot_file(f, 7)
    out = tmp_path / "t"
    argv = ["tune", "--out", str(out), "--tasks", str(f), "--answer-regex", r";(-?\d+)", "--dev", "4", "--test", "3"]
    assert main([*argv, *GRID]) == 0
    text = capsys.readouterr().out
    assert "4 dev + 3 test tasks" in text and "test acc" in text and "on the 3 test tasks" in text
    data = json.loads((out / "tune.json").read_text())
    assert data["setup"]["dev"] == 4 and data["setup"]["test"] == 3
    assert data["setup"]["tasks_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    engine = Engine.from_pretrained()
    for spec, rec in data["configs"].items():
        gens = [engine.generate(p.prompt, bench.policy_options(spec, 64))[0] for p in problems]
        want = [toy_task.check_answer(p, g.text) for p, g in zip(problems, gens)]  # the toy's own check
        assert rec["correct"] == want, spec
        assert rec["accuracy"] == sum(want[:4]) / 4 and rec["n"] == 4
        assert rec["test"]["accuracy"] == sum(want[4:]) / 3 and rec["test"]["n"] == 3
        assert rec["mean_nfe"] == sum(g.stats["nfe"] for g in gens[:4]) / 4
        assert rec["test"]["mean_nfe"] == sum(g.stats["nfe"] for g in gens[4:]) / 3
        assert rec["test"]["mean_model_ms"] > 0
    assert (out / "tune_bench_gpu_step.png").stat().st_size > 10_000
    ev = json.loads((out / "preset.json").read_text())["evidence"]
    chosen = ev["config"]
    assert ev["dev"]["accuracy"] == data["configs"][chosen]["accuracy"] and ev["dev"]["n"] == 4
    assert ev["test"]["accuracy"] == data["configs"][chosen]["test"]["accuracy"] and ev["test"]["n"] == 3
    assert ev["tasks"]["sha256"] == data["setup"]["tasks_sha256"] and ev["tasks"]["source"] == str(f)
    assert ev["tasks"]["check"] == r"regex ;(-?\d+)"
    assert ev["model"]["path"] == "toy" and len(ev["model"]["config_sha256"]) == 64
    assert presets.get(str(out / "preset.json")).options["policy"] == "dual"


def test_tune_on_an_lm_eval_task_equals_direct_decodes_scored_by_its_metric(tmp_path):
    from blockbatch import Engine

    out = tmp_path / "t"
    argv = ["tune", "--out", str(out), "--lm-eval-task", "blockbatch_toy_arith", "--include-path", str(TASK_DIR)]
    assert main([*argv, "--n", "5", *GRID]) == 0
    data = json.loads((out / "tune.json").read_text())
    assert data["setup"]["tasks"] == "lm-eval:blockbatch_toy_arith" and data["scored_by"] == "answers"
    rows = _toy_rows()[:5]
    engine = Engine.from_pretrained()
    for spec, rec in data["configs"].items():
        gens = [engine.generate(r["prompt"], bench.policy_options(spec, 64))[0] for r in rows]
        assert rec["correct"] == [g.text.split("\n")[0] == r["response"] for g, r in zip(gens, rows)], spec


def test_tune_task_flag_errors_are_one_line(tmp_path, capsys):
    f = tmp_path / "cot.jsonl"
    _cot_file(f, 5)
    base = ["tune", "--out", str(tmp_path / "t"), "--quiet"]
    cases = [
        (["--tasks", str(f), "--dev", "3", "--test", "4"], "holds 5 tasks; --dev 3 --test 4 needs 7"),
        (["--tasks", str(f), "--n", "3", "--dev", "3"], "--n and --dev"),
        (["--tasks", str(f), "--answer", "last-number", "--answer-regex", "x"], "--answer and --answer-regex"),
        (["--answer-regex", "x"], "the toy task has its own check"),
        (["--tasks", str(f), "--lm-eval-task", "x"], "--tasks and --lm-eval-task"),
        (["--tasks", str(f), "--include-path", "x"], "--include-path goes with --lm-eval-task"),
        (["--tasks", str(f), "--answer-regex", "(x"], "--answer-regex '(x': not a valid regular expression"),
    ]
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_no_chat_decodes_task_text_without_the_template(tmp_path):
    """tune --no-chat: a task file's text is encoded as it is (the setup records it); without the
    flag a checkpoint's chat template wraps it (3 more tokens here)."""
    templated_toy_checkpoint(tmp_path / "ckpt")
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"prompt": "12+1=__", "answer": "13"}) + "\n")
    runs = {}
    for flag in ([], ["--no-chat"]):
        out = tmp_path / ("raw" if flag else "chat")
        args = ["tune", "--model", str(tmp_path / "ckpt"), "--tasks", str(f), "--n", "1", *GRID]
        assert main([*args, "--block-lengths", "64", "--out", str(out), *flag]) == 0
        runs[bool(flag)] = json.loads((out / "tune.json").read_text())
    assert runs[True]["setup"]["encoding"] == "raw" and "encoding" not in runs[False]["setup"]
    [raw], [chat] = (list(runs[k]["configs"].values()) for k in (True, False))
    assert raw["lengths"] == [len("12+1=__") + 64] and chat["lengths"] == [len("12+1=__") + 3 + 64]
