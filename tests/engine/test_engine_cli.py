"""Engine and CLI on a checkpoint with a tokenizer (random weights; the toy model has its own tests)."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from blockbatch.engine import Engine, Generation
from blockbatch.loading import save_checkpoint
from blockbatch.decoding import run_decode
from blockbatch.options import DecodeOptions
from blockbatch.random_checkpoint import random_config, random_weights
from blockbatch.toy import tokenizer as toy_tok
from helpers.checkpoints import templated_toy_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    config = random_config(
        vocab_size=toy_tok.VOCAB_SIZE,
        mask_token_id=toy_tok.MASK_ID,
        eos_token_id=toy_tok.EOS_ID,
        pad_token_id=toy_tok.PAD_ID,
        d_model=64,
        n_layers=2,
    )
    save_checkpoint(path, config, random_weights(config, seed=2, logit_scale=5.0), tokenizer=toy_tok.build_tokenizer())
    return str(path), config


def test_generate_text_and_ids_agree(ckpt):
    path, config = ckpt
    engine = Engine.from_pretrained(path)
    options = DecodeOptions(policy="dual", gen_length=32, block_length=8)
    [by_text] = engine.generate("12+3=", options)
    ids = engine.codec.encode("12+3=")
    [by_ids] = engine.generate(ids, options)
    [by_tensor] = engine.generate(torch.tensor(ids), options)
    assert isinstance(by_text, Generation)
    assert by_text.ids == by_ids.ids == by_tensor.ids and by_text.prompt_ids == ids
    assert by_text.text == engine.codec.decode(by_text.ids)
    assert len(by_text.raw_ids) == 32 and by_text.ids == by_text.raw_ids[: len(by_text.ids)]
    assert config.eos_token_id not in by_text.ids
    direct = run_decode(engine.model.obj, torch.tensor(ids), options)
    assert direct.tokens[len(ids) :].tolist() == by_text.raw_ids


def test_output_trimmed_at_first_eos(ckpt):
    path, config = ckpt
    engine = Engine.from_pretrained(path)
    raw = [5, 6, config.eos_token_id, 7, config.eos_token_id]
    assert engine.codec.trim(raw) == [5, 6]


def test_batch_of_prompts_equals_one_by_one(ckpt):
    path, _ = ckpt
    engine = Engine.from_pretrained(path)
    options = DecodeOptions(policy="blockbatch", gen_length=32, block_sizes=(4, 8, 32))
    prompts = ["1+2=", "45-3+9=", "7="]
    together = engine.generate(prompts, options)
    alone = [engine.generate(p, options)[0] for p in prompts]
    assert [g.raw_ids for g in together] == [g.raw_ids for g in alone]
    assert together[1].stats["policy"] == "blockbatch" and len(together[1].stats["branches"]) == 3


def test_generate_n_gives_n_per_prompt_with_seeds_seed_plus_i(ckpt):
    """n generations per prompt, in order (prompt 0's n, then prompt 1's), generation i decoding with
    seed + i: each equals the decode of that seed alone, batched or not; greedy ones are equal."""
    path, _ = ckpt
    engine = Engine.from_pretrained(path)
    prompts = ["1+2=", "45-3+9="]
    sampled = DecodeOptions(policy="dual", gen_length=32, block_length=8, temperature=3.0, seed=11)
    for max_batch in (1, 4):
        got = engine.generate(prompts, sampled, n=3, max_batch=max_batch)
        alone = [engine.generate(p, sampled.replace(seed=11 + i))[0] for p in prompts for i in range(3)]
        assert [g.raw_ids for g in got] == [g.raw_ids for g in alone]
        assert [g.prompt_ids for g in got] == [engine.codec.encode(p) for p in prompts for _ in range(3)]
    assert len({tuple(g.raw_ids) for g in got[:3]}) > 1  # the seeds make different draws
    greedy = engine.generate(prompts[0], DecodeOptions(policy="dual", gen_length=32, block_length=8), n=2)
    assert greedy[0].raw_ids == greedy[1].raw_ids
    for bad, error in ((0, ValueError), (17, ValueError), (True, TypeError), (2.0, TypeError)):
        with pytest.raises(error, match="^n must be an integer"):
            engine.generate(prompts[0], sampled, n=bad)
    with pytest.raises(ValueError, match="^seed: .*seed \\+ i"):
        engine.generate(prompts[0], sampled.replace(seed=(1 << 63) - 2), n=3)


def test_engine_bad_prompts(ckpt):
    path, config = ckpt
    engine = Engine.from_pretrained(path)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate("")
    with pytest.raises(ValueError, match=r"prompt_ids\[0\] is the mask id"):
        engine.generate([config.mask_token_id, 3])
    with pytest.raises(ValueError, match=r"is outside the vocabulary"):
        engine.generate([config.vocab_size + 5])
    with pytest.raises(TypeError, match="must be int64"):
        engine.generate(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="no CUDA device"):
        if not torch.cuda.is_available():
            Engine.from_pretrained(path, device="cuda")
        else:
            raise ValueError("no CUDA device (skipped: a GPU is present)")


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_cli_generate_prints_text_and_stats(ckpt):
    path, _ = ckpt
    res = _cli("generate", "--model", path, "--gen-length", 32, "--block-length", 8, "12+3=")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1].startswith("  [dual block 8] nfe=") and "tokens/forward" in lines[-1]


def test_cli_generate_json_and_progress(ckpt):
    path, _ = ckpt
    res = _cli(
        "generate",
        "--model",
        path,
        "--policy",
        "blockbatch",
        "--gen-length",
        32,
        "--block-sizes",
        "4,8,32",
        "--json",
        "1+1=",
        "2+2=",
    )
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == ["1+1=", "2+2="]
    assert all(r["stats"]["nfe"] >= 1 and len(r["stats"]["branches"]) == 3 for r in rows)
    res = _cli("generate", "--model", path, "--gen-length", 32, "1+1=", "2+2=", "3+3=")
    assert res.returncode == 0 and "3/3" in res.stderr  # progress bar with several prompts
    eager = _cli(
        "generate",
        "--model",
        path,
        "--policy",
        "blockbatch",
        "--gen-length",
        32,
        "--block-sizes",
        "4,8,32",
        "--json",
        "--no-cuda-graphs",
        "1+1=",
        "2+2=",
    )
    assert eager.returncode == 0, eager.stderr
    assert [json.loads(line)["text"] for line in eager.stdout.splitlines()] == [r["text"] for r in rows]


def test_cli_generate_n_prints_each_prompts_n_generations(ckpt):
    """--n 2 with two PROMPTs: prompt 0's two generations, then prompt 1's, generation i with seed
    --seed + i: the engine's Engine.generate(n=2) texts; --n past 16 and --n with --input refused."""
    path, _ = ckpt
    flags = ["--policy", "dual", "--gen-length", 32, "--block-length", 8, "--temperature", 3.0, "--seed", 11]
    res = _cli("generate", "--model", path, *flags, "--n", 2, "--json", "1+2=", "45-3+9=")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["prompt"], r["choice"], r["seed"]) for r in rows] == [
        ("1+2=", 0, 11),
        ("1+2=", 1, 12),
        ("45-3+9=", 0, 11),
        ("45-3+9=", 1, 12),
    ]
    engine = Engine.from_pretrained(path)
    options = DecodeOptions(policy="dual", gen_length=32, block_length=8, temperature=3.0, seed=11)
    assert [r["ids"] for r in rows] == [g.ids for g in engine.generate(["1+2=", "45-3+9="], options, n=2)]
    text = _cli("generate", "--model", path, *flags, "--n", 2, "1+2=")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0] == f"'1+2=' #0 (seed 11) -> {rows[0]['text']!r}"
    assert text.stdout.splitlines()[2] == f"'1+2=' #1 (seed 12) -> {rows[1]['text']!r}"
    for bad, pattern in (
        (["--n", 17, "1+2="], "argument --n: must be in \\[1, 16\\], got 17"),
        (["--n", 2, "--input", "-"], "--n 2 applies to PROMPTs only"),
    ):
        res = _cli("generate", "--model", path, *bad)
        assert res.returncode != 0 and "Traceback" not in res.stderr
        assert re.search(pattern, res.stderr), res.stderr


def test_cli_generate_logprobs_are_the_engines(ckpt):
    """--logprobs 2 --json: per token its id, text, log-prob and top 2, Engine.generate's with
    logprobs=2; the text form prints a line per token; out of range: one clear error naming logprobs."""
    path, _ = ckpt
    flags = ["--policy", "dual", "--gen-length", 32, "--block-length", 8]
    res = _cli("generate", "--model", path, *flags, "--logprobs", 2, "--json", "1+2=")
    assert res.returncode == 0, res.stderr
    [row] = [json.loads(line) for line in res.stdout.splitlines()]
    engine = Engine.from_pretrained(path)
    [g] = engine.generate("1+2=", DecodeOptions(policy="dual", gen_length=32, block_length=8, logprobs=2))
    assert row["ids"] == g.ids and len(row["logprobs"]) == len(g.ids) > 0
    decode = engine.codec.decode
    assert row["logprobs"] == [
        {
            "id": t.token,
            "text": decode([t.token]),
            "logprob": t.logprob,
            "top": [{"id": i, "text": decode([i]), "logprob": v} for i, v in t.top],
        }
        for t in g.logprobs
    ]
    text = _cli("generate", "--model", path, *flags, "--logprobs", 2, "1+2=")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == 2 + len(g.ids) and lines[2].startswith(f"  {decode([g.ids[0]])!r} {g.logprobs[0].logprob:.4f}")
    for bad, pattern in ((["--logprobs", 21], "logprobs"), (["--logprobs", -1], "logprobs")):
        res = _cli("generate", "--model", path, "--gen-length", 32, *bad, "1+2=")
        assert res.returncode != 0 and "Traceback" not in res.stderr and re.search(pattern, res.stderr), res.stderr


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["--gen-length", "30", "--block-length", "8"], "block_length = 8 must divide gen_length = 30"),
        (["--threshold", "1.5"], "^error: threshold must be in \\(0, 1\\], got 1.5$"),
        (["--threshold", "high"], "argument --threshold: expected a number or 'none', got 'high'"),
        (["--policy", "blockbatch", "--block-sizes", "4,4"], "block_sizes must not repeat a size"),
        (["--model", "/nonexistent/x"], "not a checkpoint folder"),
    ],
)
def test_cli_errors_are_one_clear_line(ckpt, args, pattern):
    import re

    path, _ = ckpt
    base = ["generate"] + (["--model", path] if "--model" not in args else [])
    res = _cli(*base, *args, "1+1=")
    assert res.returncode != 0
    assert re.search(pattern, res.stderr), res.stderr
    assert "Traceback" not in res.stderr


def test_cli_help_teaches():
    res = _cli("generate", "--help")
    assert res.returncode == 0
    for flag in (
        "--policy",
        "--block-sizes",
        "--merge-gate",
        "--sync-gap",
        "--refresh-tokens",
        "--threshold",
        "examples:",
    ):
        assert flag in res.stdout


def test_cli_help_lists_every_cuda_environment_variable():
    """Each BLOCKBATCH_* variable the C++ sources read (std::getenv, env_choice, env_int) is explained
    by generate --help."""
    import pathlib
    import re

    src = pathlib.Path(__file__).resolve().parents[2] / "csrc"
    pattern = r'(?:getenv|env_choice|env_int)\("(BLOCKBATCH_\w+)"'  # ops/cuda/settings.cpp reads them through helpers
    read = {m for f in src.rglob("*.c*") for m in re.findall(pattern, f.read_text())}
    assert {
        "BLOCKBATCH_ATTN_KERNEL",
        "BLOCKBATCH_ROPE_KERNEL",
        "BLOCKBATCH_CUDA_BATCHING",
    } <= read  # the scan finds them
    res = _cli("generate", "--help")
    assert res.returncode == 0
    missing = sorted(v for v in read if f"{v}=" not in res.stdout)
    assert not missing, f"generate --help does not explain {missing}"
    from blockbatch import settings

    assert settings.help_text() in res.stdout  # the block is rendered from the settings table
    # The defaults ops/cuda/settings.cpp compiles in are the ones the help states.
    defaults = re.findall(
        r'constexpr [\w ]+\* kDefault\w+ = "?(\w+)"?;\s+// (BLOCKBATCH_\w+)|'
        r"constexpr int kDefault\w+ = (\d+);\s+// (BLOCKBATCH_\w+)",
        (src / "ops" / "cuda" / "settings.cpp").read_text(),
    )
    pairs = [(a or c, b or d) for a, b, c, d in defaults]
    assert {v for _, v in pairs} >= {"BLOCKBATCH_ATTN_KERNEL", "BLOCKBATCH_ROPE_KERNEL", "BLOCKBATCH_CUDA_BATCHING"}
    for value, var in pairs:
        text = res.stdout[res.stdout.index(f"{var}=") :]
        text = text[: text.index("BLOCKBATCH_", len(var))] if "BLOCKBATCH_" in text[len(var) :] else text
        assert f"default {value}" in text, f"generate --help does not give {var}'s default ({value})"


def test_chat_template_is_applied(tmp_path):
    template = templated_toy_checkpoint(tmp_path)
    engine = Engine.from_pretrained(tmp_path)
    assert engine.checkpoint.chat_template == template
    chat_ids = engine.encode("12")
    plain_ids = engine.encode("12", chat=False)
    assert engine.codec.decode(chat_ids) == "=12;+"
    assert engine.codec.decode(plain_ids) == "12"
    options = DecodeOptions(gen_length=16, block_length=8)
    assert engine.generate("12", options)[0].prompt_ids == chat_ids.tolist()
    assert engine.generate("12", options, chat=False)[0].prompt_ids == plain_ids.tolist()


def test_cli_bench_with_reference_comparison(ckpt, tmp_path):
    path, _ = ckpt
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"prompt": p, "answer": "x"}) for p in ("1+1=", "12-3=", "5=")) + "\n")
    out = tmp_path / "out"
    res = _cli(
        "bench",
        "--model",
        path,
        "--tasks",
        tasks,
        "--n",
        3,
        "--gen-length",
        32,
        "--policies",
        "vanilla",
        "dual:block_length=8",
        "blockbatch:block_sizes=4/8/32,sync_gap=4",
        "--compare-reference",
        "--out",
        out,
        "--quiet",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "bench.json").read_text())
    assert set(data["summary"]) == {"vanilla", "dual:block_length=8", "blockbatch:block_sizes=4/8/32,sync_gap=4"}
    assert len(data["records"]) == 9 and data["environment"]["torch"] == torch.__version__
    for s in data["summary"].values():
        assert s["reference_token_equal"] == 1.0  # the native engine decodes exactly what the reference does
        assert s["speedup_vs_reference"] > 0 and s["mean_nfe"] >= 1
    assert "x ref" in res.stdout and "peak RSS" in res.stdout
    if importlib.util.find_spec("matplotlib") is not None:  # installed by the README test command
        png = (out / "accuracy_vs_nfe.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_bench_rejects_bad_policy_spec():
    from blockbatch.bench import policy_options

    with pytest.raises(ValueError, match="policy must be one of"):
        policy_options("greedy", 64)
    with pytest.raises(ValueError, match="unknown option 'gate'"):
        policy_options("blockbatch:gate=3", 64)
    assert policy_options("blockbatch:block_sizes=8/32,sync_gap=4", 64).block_sizes == (8, 32)
    assert policy_options("dual:cuda_graphs=false", 64).cuda_graphs is False


def test_cli_generate_jsonl_batched(tmp_path):
    """--input JSONL --output JSONL --max-batch: one line per request, bad lines named by line
    number without stopping the others, each result the one its prompt gives alone."""
    from blockbatch.engine import Engine
    from blockbatch.options import DecodeOptions

    src = tmp_path / "req.jsonl"
    src.write_text(
        '{"id": "a", "prompt": "72-2=__-3=__-3=__...............?"}\n'
        "not json\n\n"
        '{"ids": [3, 4, 5]}\n'
        '{"prompt": "x", "ids": [1]}\n'
        '{"prompt": "9-2=__-1=__...........?"}\n'
        '{"ids": [' + ", ".join(["3"] * 60) + "]}\n",
        encoding="utf-8",
    )
    out = tmp_path / "out.jsonl"
    res = _cli(
        "generate",
        "--input",
        src,
        "--output",
        out,
        "--max-batch",
        2,
        "--gen-length",
        64,
        "--policy",
        "dual",
        "--no-chat",
        "--max-length",
        110,
    )
    assert res.returncode == 1, res.stderr  # three bad lines
    assert f"{src}:2: Expecting value" in res.stderr and f"{src}:5: give exactly one of" in res.stderr
    assert (
        f"{src}:7: the prompt (60 tokens) plus gen_length (64) needs 124 positions but this scheduler's "
        f"max_length is 110" in res.stderr
    )
    assert "3 done, 3 failed" in res.stderr
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    errors = {r["line"]: r for r in lines if "error" in r}
    assert set(errors) == {2, 5, 7}
    results = {r["id"]: r for r in lines if "error" not in r}
    assert set(results) == {"a", 4, 6}
    engine = Engine.from_pretrained()
    options = DecodeOptions(policy="dual", gen_length=64)
    for rid, prompt in (("a", "72-2=__-3=__-3=__...............?"), (4, [3, 4, 5]), (6, "9-2=__-1=__...........?")):
        [g] = engine.generate([prompt], options, chat=False)
        assert (results[rid]["ids"], results[rid]["text"], results[rid]["nfe"]) == (g.ids, g.text, g.stats["nfe"])
    assert results["a"]["text"] == "72-2=70-3=67-3=64;64"
    res = _cli("generate", "--input", src, "PROMPT")
    assert res.returncode == 2 and "either PROMPTs or --input" in res.stderr


def _cli_bytes(*args, stdin: bytes = b"", env: dict | None = None):
    """The CLI with ``stdin`` as bytes; stdout and stderr decoded as UTF-8."""
    res = subprocess.run(
        [sys.executable, "-m", "blockbatch.cli", *map(str, args)],
        input=stdin,
        capture_output=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )
    return subprocess.CompletedProcess(
        res.args, res.returncode, res.stdout.decode("utf-8"), res.stderr.decode("utf-8", "replace")
    )


def test_cli_generate_jsonl_refuses_its_input_as_output(tmp_path):
    """--output naming --input's file (by name, through a symbolic or hard link, or the file
    stdin reads) would replace the requests: one error line naming both, status 2, input intact."""
    src = tmp_path / "req.jsonl"
    text = '{"prompt": "72-2=__-3=__-3=__...............?"}\n'
    src.write_text(text, encoding="utf-8")
    (tmp_path / "link.jsonl").symlink_to(src)
    os.link(src, tmp_path / "hard.jsonl")
    for inp, out in ((src, src), (src, tmp_path / "link.jsonl"), (tmp_path / "hard.jsonl", src)):
        res = _cli("generate", "--input", inp, "--output", out, "--gen-length", 32)
        assert res.returncode == 2, res.stderr
        assert (
            res.stderr.strip() == f"error: --input {inp} and --output {out} are the same file: the results "
            f"would replace the requests; write them to another file"
        ), res.stderr
    with open(src, "rb") as f:
        res = subprocess.run(
            [sys.executable, "-m", "blockbatch.cli", "generate", "--input", "-", "--output", src],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert res.returncode == 2 and "--input - and --output" in res.stderr, res.stderr
    assert src.read_text(encoding="utf-8") == text and "Traceback" not in res.stderr


def test_cli_generate_jsonl_output_is_replaced_only_by_results(tmp_path):
    """A regular --output is written through a temporary file renamed over it at the end: an
    existing file keeps its mode and is replaced by the run's lines (through a symbolic link: the
    file it names), a run that fails before any result leaves it as it was, nothing is left
    behind; a FIFO is written directly."""
    import stat
    import threading

    src = tmp_path / "req.jsonl"
    src.write_text(
        '{"id": "a", "prompt": "9-2=__-1=__...........?"}\n{"id": "b", "ids": [3, 4, 5]}\n', encoding="utf-8"
    )
    out = tmp_path / "out.jsonl"
    out.write_text("old\n", encoding="utf-8")
    os.chmod(out, 0o640)
    res = _cli("generate", "--input", src, "--output", out, "--max-length", 9999, "--gen-length", 32)
    assert res.returncode == 2 and "max_length" in res.stderr, res.stderr
    assert out.read_text(encoding="utf-8") == "old\n"  # failed before any result: untouched
    res = _cli("generate", "--input", src, "--output", out, "--gen-length", 32, "--no-chat")
    assert res.returncode == 0, res.stderr
    assert sorted(json.loads(x)["id"] for x in out.read_text(encoding="utf-8").splitlines()) == ["a", "b"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    link = tmp_path / "link.jsonl"
    link.symlink_to(out)
    res = _cli("generate", "--input", src, "--output", link, "--gen-length", 32, "--no-chat")
    assert res.returncode == 0 and link.is_symlink() and len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "out.jsonl", "req.jsonl"]  # no temporaries
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text(encoding="utf-8")))
    reader.start()
    res = _cli("generate", "--input", src, "--output", fifo, "--gen-length", 32, "--no-chat")
    reader.join(timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(got[0].splitlines()) == 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_cli_generate_jsonl_each_bad_line_is_an_error_line():
    """docs/cli.md's promise, for lines that once aborted the run: not UTF-8, a UTF-8 BOM (through
    stdin under a C locale), 100000 nested brackets, ids that are no int64 token id; each is one
    error line naming its line, the others decode."""
    good = '{"id": "g", "prompt": "72-2=__-3=__-3=__...............?"}\n'
    res = _cli_bytes(
        "generate",
        "--input",
        "-",
        "--gen-length",
        32,
        stdin=b'{"prompt":"1+1"}\n\xff\n',
        env={"LC_ALL": "C", "LANG": "C"},
    )
    assert res.returncode == 1, res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(rows) == 2 and [r["line"] for r in rows if "error" in r] == [2], rows
    assert "error: stdin:2: not UTF-8 text (byte 0xff at byte offset 0 of the line)" in res.stderr
    lines = [
        good,
        b"caf\xc3\xa9 \xe9\n".decode("latin-1"),
        "[" * 100000 + "\n",
        '{"ids": [1e400]}\n',
        '{"ids": [1000000000000000000000000000000]}\n',
        '{"ids": [true]}\n',
        '{"ids": [3, -1]}\n',
        '{"id": 7, "ids": [3, 4], "prompt": "x"}\n',
        good,
    ]
    data = b"\xef\xbb\xbf" + "".join(lines).encode("latin-1")
    res = _cli_bytes(
        "generate",
        "--input",
        "-",
        "--gen-length",
        32,
        "--no-chat",
        stdin=data,
        env={"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": ""},
    )
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    errors = {r["line"]: r["error"] for r in rows if "error" in r}
    assert [r["id"] for r in rows if "error" not in r] == ["g", "g"]  # line 1 (after its BOM) and line 9
    assert errors == {
        2: "not UTF-8 text (byte 0xe9 at byte offset 6 of the line)",
        3: "not valid JSON (nested too deeply)",
        4: "ids[0] must be an integer token id, got float inf",
        5: "ids[0] = 1000000000000000000000000000000 is outside the vocabulary [0, 21)",
        6: "ids[0] must be an integer token id, got bool True",
        7: "ids[1] = -1 is outside the vocabulary [0, 21)",
        8: 'give exactly one of "prompt" (text) and "ids" (token ids)',
    }, errors
    assert [r["id"] for r in rows if r.get("line") == 8] == [7]
