"""xgrammar against llguidance on the byte-level BPE tokenizer: which grammar library structured output
(issue 56 item 1) should compile its grammars with.

    pip install -e ".[grammar-bench]"   # xgrammar, llguidance
    python benchmarks/bench_grammar.py [--vocabs 4096 32768] [--repeats 5] [--tokenizer-cache DIR] \\
        [--out docs/bench/grammar/bench_grammar.json]

Per vocabulary size (``random_tokenizer.build_bpe_tokenizer``: the 256 bytes, merges trained on
generated JSON and English-like text, the markup and special tokens) and library:

* ``tokenizer_ms``: building the library's view of the tokenizer (once per model);
* per grammar (a JSON schema of a tool call, any JSON object, a regex, a choice list):
  ``compile_ms``, the median over ``--repeats`` fresh compiles (xgrammar: ``GrammarCompiler``'s
  compile with its cache off; llguidance: a new ``LLMatcher``, which compiles lazily, plus its first
  mask), ``mask_us``: the time to compute the allowed-token mask at each position of a valid output
  (its canonical tokens, accepted one by one; median, p90, max over the positions and repeats),
  ``accept_us`` (accepting one token), ``rollback_us`` (taking back every accepted token at once),
  ``validate_run_us`` (how many of the whole output's tokens the grammar takes in a row from the
  start, nothing consumed: the frontier's check of a run of proposals; llguidance's
  ``validate_tokens``, xgrammar accepting them one by one and rolling back),
  and checks that after the rollback the mask is the first position's again and that a token the
  grammar forbids at the start is refused;
* ``rss_mib``: the process's resident memory growth over the library's whole run (tokenizer and
  grammars), xgrammar's own count of its compiled grammars' bytes where it gives one.

Single-threaded (``--threads``, default 1) on the CPU, as a mask is computed per request on the host.
Writes the JSON and a PNG beside it (mask time and compile time per grammar)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from common import environment, write_json, write_png  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["get_weather", "search"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city", "days", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
REGEX = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [A-Z][a-z]+( [a-z]+){0,8}\."
CHOICES = ["positive", "negative", "neutral", "mixed", "unknown"]
# (grammar, a valid output to walk)
GRAMMARS = {
    "json_schema": (
        SCHEMA,
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "celsius", '
        '"tags": ["rain", "wind"]}}',
    ),
    "json_object": (
        None,
        '{"order": {"id": 1234, "items": [{"name": "tea", "price": 3.5}, {"name": "cake", "price": 4.25}], '
        '"paid": true, "note": null}, "user": "ada"}',
    ),
    "regex": (REGEX, "2026-12-07T23:59:01Z Rain expected in the north by noon."),
    "choice": (CHOICES, "neutral"),
}


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def quantiles(values: list[float]) -> dict:
    values = sorted(values)
    return {
        "median": statistics.median(values),
        "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
        "max": values[-1],
    }


# ------------------------------------------------------------------------------------ xgrammar


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, threads: int):
        import xgrammar as xgr

        self.xgr = xgr
        vocab = [tok.id_to_token(i) for i in range(tok.get_vocab_size())]
        self.n = len(vocab)
        eos = tok.token_to_id("<|endoftext|>")
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=self.n, stop_token_ids=[eos])
        self.threads = threads
        self.compiled_bytes = 0

    def compile(self, kind: str, grammar):
        xgr = self.xgr
        compiler = xgr.GrammarCompiler(self.info, max_threads=self.threads, cache_enabled=False)
        if kind == "json_schema":
            compiled = compiler.compile_json_schema(json.dumps(grammar), any_whitespace=False)
        elif kind == "json_object":
            compiled = compiler.compile_builtin_json_grammar()
        elif kind == "regex":
            compiled = compiler.compile_regex(grammar)
        else:
            compiled = compiler.compile_regex("(" + "|".join(grammar) + ")")
        self.compiled_bytes = max(self.compiled_bytes, int(getattr(compiled, "memory_size_bytes", 0)))
        matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=200)
        self.mask = xgr.allocate_token_bitmask(1, self.n)
        return matcher

    def fill(self, matcher):
        matcher.fill_next_token_bitmask(self.mask)
        return self.mask

    def allowed(self, mask, token: int) -> bool:
        return bool((int(mask[0, token // 32]) >> (token % 32)) & 1)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def rollback(self, matcher, k: int) -> None:
        matcher.rollback(k)

    def validate(self, matcher, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar accepts in a row from here, the state left as it was
        (xgrammar has no call for it: accept them one by one, then roll back)."""
        n = 0
        for token in tokens:
            if not matcher.accept_token(token):
                break
            n += 1
        matcher.rollback(n)
        return n


# ------------------------------------------------------------------------------------ llguidance


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, threads: int):
        import llguidance
        import llguidance.torch

        self.llg = llguidance
        self.n = tok.get_vocab_size()
        eos = tok.token_to_id("<|endoftext|>")
        self.tokenizer = llguidance.LLTokenizer(tok.to_str(), n_vocab=self.n, eos_token=eos)
        self.compiled_bytes = 0

    def compile(self, kind: str, grammar):
        llg = self.llg
        if kind == "json_schema":
            text = llg.LLMatcher.grammar_from_json_schema(json.dumps(grammar))
        elif kind == "json_object":
            text = llg.LLMatcher.grammar_from_json_schema(json.dumps({"type": "object"}))
        elif kind == "regex":
            text = llg.LLMatcher.grammar_from_regex(grammar)
        else:
            text = llg.LLMatcher.grammar_from_regex("(" + "|".join(grammar) + ")")
        matcher = llg.LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        self.mask = llg.torch.allocate_token_bitmask(1, self.n)
        self.fill(matcher)  # it compiles lazily: the first mask is part of compiling
        return matcher

    def fill(self, matcher):
        self.llg.torch.fill_next_token_bitmask(matcher, self.mask, 0)
        return self.mask

    def allowed(self, mask, token: int) -> bool:
        return bool((int(mask[0, token // 32]) >> (token % 32)) & 1)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token) and not matcher.is_error()

    def rollback(self, matcher, k: int) -> None:
        matcher.rollback(k)

    def validate(self, matcher, tokens: list[int]) -> int:
        return matcher.validate_tokens(tokens)


def run_library(cls, tok, repeats: int, threads: int) -> dict:
    """One library's numbers on ``tok`` (the module's docstring); its modules are imported already."""
    gc.collect()
    rss0 = rss_mib()
    t0 = time.perf_counter()
    lib = cls(tok, threads)
    out: dict = {"tokenizer_ms": (time.perf_counter() - t0) * 1e3, "grammars": {}}
    for kind, (grammar, sample) in GRAMMARS.items():
        ids = tok.encode(sample, add_special_tokens=False).ids
        compile_ms, mask_us, accept_us, rollback_us, validate_us = [], [], [], [], []
        checks = {
            "walk_accepted": True,
            "rollback_restores_mask": True,
            "forbidden_refused": True,
            "run_validated": True,
        }
        for _ in range(repeats):
            t = time.perf_counter()
            matcher = lib.compile(kind, grammar)
            compile_ms.append((time.perf_counter() - t) * 1e3)
            first = lib.fill(matcher).clone()
            # a run of proposals reaching the frontier: how many the grammar takes, nothing consumed
            t = time.perf_counter()
            taken = lib.validate(matcher, ids)
            validate_us.append((time.perf_counter() - t) * 1e6)
            checks["run_validated"] &= taken == len(ids)
            forbidden = next(i for i in range(lib.n) if not lib.allowed(first, i))
            for token in ids:
                t = time.perf_counter()
                mask = lib.fill(matcher)
                mask_us.append((time.perf_counter() - t) * 1e6)
                checks["walk_accepted"] &= lib.allowed(mask, token)
                t = time.perf_counter()
                ok = lib.accept(matcher, token)
                accept_us.append((time.perf_counter() - t) * 1e6)
                checks["walk_accepted"] &= ok
            t = time.perf_counter()
            lib.rollback(matcher, len(ids))
            rollback_us.append((time.perf_counter() - t) * 1e6)
            checks["rollback_restores_mask"] &= bool((lib.fill(matcher) == first).all())
            checks["forbidden_refused"] &= not lib.accept(matcher, forbidden)
        out["grammars"][kind] = {
            "tokens": len(ids),
            "compile_ms": statistics.median(compile_ms),
            "mask_us": quantiles(mask_us),
            "accept_us": statistics.median(accept_us),
            "rollback_us": statistics.median(rollback_us),
            "validate_run_us": statistics.median(validate_us),
            **checks,
        }
        if not all(checks.values()):
            print(f"warning: {lib.name} {kind}: {checks}", file=sys.stderr)
    out["rss_mib"] = rss_mib() - rss0
    if lib.compiled_bytes:
        out["largest_compiled_grammar_kib"] = lib.compiled_bytes / 1024
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocabs", type=int, nargs="+", default=[4096, 32768])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokenizer-cache", default=None, help="folder to keep the trained tokenizers in (32K: ~30 s)")
    p.add_argument("--out", default="docs/bench/grammar/bench_grammar.json")
    args = p.parse_args(argv)
    import torch
    from tokenizers import Tokenizer

    import importlib.metadata

    import llguidance  # noqa: F401  (imported here, not in the libraries' timed setup)
    import llguidance.torch  # noqa: F401
    import xgrammar  # noqa: F401

    from blockbatch.random_tokenizer import build_bpe_tokenizer

    torch.set_num_threads(args.threads)
    results = {}
    for vocab in args.vocabs:
        cached = args.tokenizer_cache and os.path.join(args.tokenizer_cache, f"bpe{vocab}.json")
        t = time.perf_counter()
        if cached and os.path.exists(cached):
            tok = Tokenizer.from_file(cached)
        else:
            tok = build_bpe_tokenizer(vocab)
            if cached:
                os.makedirs(args.tokenizer_cache, exist_ok=True)
                tok.save(cached)
        print(f"vocab {vocab}: tokenizer in {time.perf_counter() - t:.1f} s", flush=True)
        results[str(vocab)] = {}
        for cls in (XGrammar, LLGuidance):
            r = run_library(cls, tok, args.repeats, args.threads)
            results[str(vocab)][cls.name] = r
            for kind, g in r["grammars"].items():
                print(
                    f"  {cls.name:10s} {kind:11s} compile {g['compile_ms']:8.2f} ms  mask median "
                    f"{g['mask_us']['median']:7.1f} us p90 {g['mask_us']['p90']:7.1f} max {g['mask_us']['max']:8.1f}"
                    f"  accept {g['accept_us']:5.1f} us  rollback {g['rollback_us']:5.1f} us"
                    f"  validate run {g['validate_run_us']:7.1f} us",
                    flush=True,
                )
            print(f"  {cls.name:10s} tokenizer {r['tokenizer_ms']:.1f} ms, rss +{r['rss_mib']:.1f} MiB", flush=True)
    payload = {
        "environment": {
            **environment(),
            "xgrammar": importlib.metadata.version("xgrammar"),
            "llguidance": importlib.metadata.version("llguidance"),
            "threads": args.threads,
        },
        "repeats": args.repeats,
        "grammars": {k: {"grammar": g, "sample": s} for k, (g, s) in GRAMMARS.items()},
        "results": results,
    }
    write_json(args.out, payload)

    def draw(axes):
        kinds = list(GRAMMARS)
        width = 0.2
        for j, (vocab, libs) in enumerate(results.items()):
            for k, (name, r) in enumerate(libs.items()):
                x = [i + (2 * j + k - 1.5) * width for i in range(len(kinds))]
                axes.bar(
                    x, [r["grammars"][g]["mask_us"]["median"] for g in kinds], width, label=f"{name}, vocab {vocab}"
                )
        axes.set_xticks(range(len(kinds)), kinds)
        axes.set_yscale("log")
        axes.set_ylabel("mask per token, median (us, log)")
        axes.set_title("grammar mask time on byte-level BPE (1 CPU thread)")
        axes.legend(fontsize=7)

    write_png(args.out, draw, size=(7, 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
