"""lm-evaluation-harness integration: the ``blockbatch`` model on a local task, no network."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

# No hub access: datasets reads these at import time.
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install lm-eval)")

from blockbatch.engine import Engine  # noqa: E402
from blockbatch.lm_eval import BlockBatchLM  # noqa: E402  (registers the model)
from blockbatch.toy import task as toy_task  # noqa: E402

TASK_DIR = Path(__file__).resolve().parents[1] / "lm_eval_task"
TASK = "blockbatch_toy_arith"


def _rows():
    with open(TASK_DIR / "toy_arith.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def lm():
    return BlockBatchLM(policy="blockbatch", device="cpu")


def test_task_file_holds_toy_problems():
    rows = _rows()
    problems = toy_task.make_problems(len(rows), 0, "test")
    assert [(r["prompt"], r["response"]) for r in rows] == [(p.prompt, p.response) for p in problems]


@pytest.mark.slow
def test_simple_evaluate_equals_direct_engine(lm):
    """Every response lm-eval scored is the one the engine gives directly, and exact_match is
    the fraction of responses equal to the reference."""
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASK_DIR)), log_samples=True
    )
    samples = out["samples"][TASK]
    rows = _rows()
    assert len(samples) == len(rows)
    engine = Engine.from_pretrained()
    options, budget = lm.options_for({"until": ["\n"], "max_gen_toks": 64, "do_sample": False})
    assert (options.policy, options.gen_length, budget) == ("blockbatch", 128, 64)  # 64 rounded up to lcm(4..128)
    correct = 0
    for s in samples:
        row = rows[s["doc_id"]]
        [gen] = engine.generate(row["prompt"], options)
        direct = engine.codec.decode(gen.ids[:budget])
        assert s["resps"][0][0] == direct
        correct += direct == row["response"]
    em = out["results"][TASK]["exact_match,none"]
    assert em == pytest.approx(correct / len(rows))
    # The toy model solves most held-out problems with BlockBatch: 11 of 16 since the early exit
    # breaks near-ties of the EOS probability towards the smallest block as the authors do
    # (issue 23; 12 of 16 before).
    assert em >= 0.625


@pytest.mark.slow
def test_cli_module_runs_local_task(tmp_path):
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    cmd = [
        sys.executable,
        "-m",
        "blockbatch.lm_eval",
        "--model",
        "blockbatch",
        "--model_args",
        "policy=dual,block_length=16,gen_length=64,threshold=0.9",
        "--tasks",
        TASK,
        "--include_path",
        str(TASK_DIR),
        "--limit",
        "4",
        "--device",
        "cpu",
        "--output_path",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "blockbatch[dual:block_length=16,threshold=0.9]: 4 requests" in proc.stderr
    [result_file] = list(tmp_path.rglob("results_*.json"))
    result = json.loads(result_file.read_text())
    assert result["config"]["model"] == "blockbatch"
    assert result["n-samples"][TASK]["effective"] == 4
    # The score is the engine's own: the first 4 problems decoded directly with the same options.
    direct = BlockBatchLM(policy="dual", block_length=16, gen_length=64, threshold=0.9, device="cpu")
    rows = _rows()[:4]
    texts = direct.generate_until(
        [_request(r["prompt"], until=["\n"], max_gen_toks=64, do_sample=False) for r in rows], disable_tqdm=True
    )
    correct = sum(text == r["response"] for text, r in zip(texts, rows))
    assert result["results"][TASK]["exact_match,none"] == pytest.approx(correct / 4)
    assert correct > 0  # the toy model solves some of them


def _request(context, **gen_kwargs):
    return types.SimpleNamespace(args=(context, gen_kwargs))


def test_until_cuts_the_text_and_max_gen_toks_the_tokens(lm):
    prompt = "72-2=__-3=__-3=__...............?"
    [full] = lm.generate_until([_request(prompt, until=["\n"], max_gen_toks=64)], disable_tqdm=True)
    assert full == "72-2=70-3=67-3=64;64"
    [cut] = lm.generate_until([_request(prompt, until=[";"], max_gen_toks=64)], disable_tqdm=True)
    assert cut == "72-2=70-3=67-3=64"
    [short] = lm.generate_until([_request(prompt, until=[], max_gen_toks=5)], disable_tqdm=True)
    assert short == "72-2="


def test_gen_length_rounding_per_policy():
    dual = BlockBatchLM(policy="dual", block_length=16, device="cpu")
    assert dual.options_for({"max_gen_toks": 100})[0].gen_length == 112
    assert dual.options_for({})[0].gen_length == 128
    vanilla, _ = BlockBatchLM(policy="vanilla", device="cpu").options_for({"max_gen_toks": 40})
    assert (vanilla.gen_length, vanilla.steps, vanilla.commit) == (64, 64, "fixed")  # one token per step
    fixed = BlockBatchLM(policy="blockbatch", block_sizes="8/32", gen_length=64, device="cpu")
    opts, budget = fixed.options_for({"max_gen_toks": 300})
    assert (opts.gen_length, opts.block_sizes, budget) == (64, (8, 32), 300)
    sampled, _ = fixed.options_for({"do_sample": True, "temperature": 0.7, "seed": 3})
    assert (sampled.temperature, sampled.seed) == (0.7, 3)


def test_bad_arguments_are_named(lm):
    with pytest.raises(ValueError, match="'block_size'"):
        BlockBatchLM(policy="dual", block_size=16)
    with pytest.raises(ValueError, match="policy must be one of"):
        BlockBatchLM(policy="greedy")
    with pytest.raises(ValueError, match="dtype must be one of"):
        BlockBatchLM(dtype="int8")
    with pytest.raises(ValueError, match="gen_length"):
        BlockBatchLM(gen_length=0)
    with pytest.raises(ValueError, match="block size 64 in block_sizes must be a positive divisor of gen_length = 96"):
        BlockBatchLM(policy="blockbatch", gen_length=96, block_sizes="32/64")
    with pytest.raises(ValueError, match="top_p=0.9"):
        lm.generate_until([_request("1+1=__", top_p=0.9)], disable_tqdm=True)
    with pytest.raises(ValueError, match="'penalty_alpha'"):
        lm.options_for({"penalty_alpha": 0.6})
    assert lm.options_for({"top_p": 1.0, "top_k": 0})[0].policy == "blockbatch"  # neutral values pass


def test_loglikelihood_is_refused_clearly(lm):
    with pytest.raises(NotImplementedError, match="loglikelihood is not supported"):
        lm.loglikelihood([_request("a")])
    with pytest.raises(NotImplementedError, match="not supported"):
        lm.loglikelihood_rolling([_request("a")])


def test_module_help_documents_the_model():
    proc = subprocess.run(
        [sys.executable, "-m", "blockbatch.lm_eval", "--help"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model_args" in proc.stdout and "gen_length" in proc.stdout and "lm-eval" in proc.stdout


def test_apply_chat_template_renders_the_checkpoints_template(tmp_path):
    """lm-eval's --apply_chat_template renders through the checkpoint's template; the rendered
    context is then encoded as is (no second BOS / template)."""
    from helpers.checkpoints import templated_toy_checkpoint

    template = templated_toy_checkpoint(tmp_path)
    model = BlockBatchLM(pretrained=str(tmp_path), policy="dual", block_length=8, gen_length=16, device="cpu")
    assert model.chat_template() == template
    rendered = model.apply_chat_template([{"role": "user", "content": "12"}, {"role": "assistant", "content": "3"}])
    assert rendered == "=12;=3;+"
    [text] = model.generate_until([_request(rendered, until=[])], disable_tqdm=True)
    engine = Engine.from_pretrained(tmp_path)
    [direct] = engine.generate(
        engine.codec.encode(rendered, chat=False, add_special_tokens=False), model.options_for({})[0]
    )
    assert text == direct.text


@pytest.mark.slow
def test_dream_toy_through_lm_eval():
    """The lm-eval model on the Dream toy (family from the checkpoint): BlockBatch with Dream's
    default branches, canvas rounded to their lcm (64), the answers the engine gives directly."""
    from blockbatch import toy

    dream = BlockBatchLM(pretrained=toy.dream_checkpoint_path(), policy="blockbatch", device="cpu")
    assert dream.engine.config.family == "dream"
    options, budget = dream.options_for({"until": ["\n"], "max_gen_toks": 40, "do_sample": False})
    assert (options.gen_length, options.resolved("block_sizes", "dream"), budget) == (64, (4, 8, 16, 32, 64), 40)
    out = _evaluate_as_the_engine(dream, options, budget)
    assert out["results"][TASK]["exact_match,none"] >= 0.5


def _evaluate_as_the_engine(model: BlockBatchLM, options, budget: int, limit: int = 6) -> dict:
    """lm-eval's results on the toy task with `model`; each answer the engine's for the same options."""
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model=model, tasks=[TASK], task_manager=TaskManager(include_path=str(TASK_DIR)), log_samples=True, limit=limit
    )
    rows = _rows()
    for s in out["samples"][TASK]:
        [gen] = model.engine.generate(rows[s["doc_id"]]["prompt"], options)
        assert s["resps"][0][0] == model.engine.codec.decode(gen.ids[:budget])
        assert gen.stats["policy"] == options.policy
    return out


@pytest.mark.slow
def test_llada2_toy_through_lm_eval():
    """The lm-eval model on the LLaDA2 toy with policy block: the answers the engine gives directly."""
    from blockbatch import toy

    llada2 = BlockBatchLM(pretrained=toy.checkpoint_path("llada2"), policy="block", device="cpu")
    assert llada2.engine.config.family == "llada2"
    options, budget = llada2.options_for({"until": ["\n"], "max_gen_toks": 40, "do_sample": False})
    assert (options.policy, options.gen_length, options.threshold, budget) == ("block", 64, 0.95, 40)
    _evaluate_as_the_engine(llada2, options, budget)
