"""Exact-match accuracy and NFE of decoders on held-out toy problems.

    python -m blockbatch.toy.evaluate [--family llada|dream | --checkpoint DIR] [--n 200] [--gen-length 64]
        [--policies vanilla,prefix,dual] [--threshold 0.9] [--block-length 32] [--json FILE]

LLaDA checkpoints: ``vanilla`` is one-token-per-step decoding (``steps = gen_length``,
lowest-confidence remasking, no threshold); ``prefix`` and ``dual`` are the Fast-dLLM cached
policies with the confidence-threshold commit rule. All run through
``blockbatch.reference.policies.generate``.

Dream checkpoints (``--family dream`` for the shipped Dream toy, or any ``--checkpoint`` whose
``config.json`` says ``model_type: "Dream"``) run the float32 Dream decoders of
``blockbatch.reference.dream`` (ALGORITHMS.md section 5): ``vanilla`` is Dream's own sampler
(``steps = gen_length`` full forwards over the whole canvas, ``--dream-alg``, entropy by default);
``prefix`` / ``dual`` are ``dream_cached`` with the threshold rule; ``blockbatch`` is
``dream_blockbatch`` (block sizes ``--block-sizes``): the oracle's decoders, which the native engine
equals token for token (tests/decode/test_dream_native.py).

Other decoders (the native engine, multi-branch decoding...) plug into ``evaluate``: a decoder is
any callable ``decoder(prompt_ids) -> generated ids``, where ``prompt_ids`` is a 1-D int64 tensor
and the result is the generated ids after the prompt (a tensor or list), optionally returned as
``(ids, nfe)``, or an object with ``tokens`` (prompt + generation) and ``nfe`` like
``ReferenceResult``. ``evaluate_batched`` takes a decoder of a list of prompts instead. The
text is cut at the first EOS; a mask left in the output makes the answer wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import Any, Callable, Sequence

import torch

from .. import families
from .. import policies as policy_registry
from ..errors import write_json_file
from ..loading import load_checkpoint
from ..options import DecodeOptions
from ..outputs import OutputError, check_output
from ..reference.dream import ALG_NAMES
from ..reference.proposals import ALGS
from ..reference.model import ReferenceModel
from ..reference.policies import shift_rows
from . import CHECKPOINT_DIRS, checkpoint_path
from . import task as toy_task
from . import tokenizer as toy_tok

EVAL_SEED = 0  # default held-out problem set: make_problems(n, EVAL_SEED, "test")
Decoder = Callable[[torch.Tensor], Any]
DREAM_BLOCK_SIZES = (4, 8, 16, 32, 64)  # dream_blockbatch's default branches (--block-sizes)
_ALG_OPTION = {v: k for k, v in ALG_NAMES.items()}  # --dream-alg (the authors' names) -> DecodeOptions.alg


def policies_for(family: str) -> tuple[str, ...]:
    """Policies ``reference_decoder`` runs for a model of ``family`` (its ``TOY_EVAL_POLICIES``)."""
    return families.get(family).TOY_EVAL_POLICIES


@dataclasses.dataclass
class EvalResult:
    name: str
    n: int
    accuracy: float  # answer exact match (check_answer)
    trace_accuracy: float  # whole response exact (check_trace)
    mean_nfe: float | None  # None when the decoder does not report NFE
    wall_s: float
    outputs: list[str] = dataclasses.field(default_factory=list, repr=False)
    correct: list[bool] = dataclasses.field(default_factory=list, repr=False)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "n": self.n,
            "accuracy": round(self.accuracy, 4),
            "trace_accuracy": round(self.trace_accuracy, 4),
            "mean_nfe": None if self.mean_nfe is None else round(self.mean_nfe, 3),
            "wall_s": round(self.wall_s, 2),
        }


def _split_output(prompt: torch.Tensor, out: Any) -> tuple[list[int], int | None]:
    """Normalise a decoder's return value to (generated ids, nfe or None)."""
    nfe = None
    if hasattr(out, "tokens"):
        nfe = getattr(out, "nfe", None)
        ids = out.tokens
        ids = ids[len(prompt) :]
    elif isinstance(out, tuple) and len(out) == 2:
        ids, nfe = out
    else:
        ids = out
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    return [int(i) for i in ids], (None if nfe is None else int(nfe))


def evaluate(
    decoder: Decoder,
    problems: Sequence[toy_task.Problem] | None = None,
    tokenizer=None,
    n: int = 200,
    seed: int = EVAL_SEED,
    name: str = "decoder",
    eos_id: int = toy_tok.EOS_ID,
    mask_id: int = toy_tok.MASK_ID,
    progress: bool = False,
) -> EvalResult:
    """Run ``decoder`` on each problem's prompt, one at a time, and check the decoded answers.

    ``problems`` defaults to ``make_problems(n, seed, "test")``; ``tokenizer`` to the toy one.
    """

    def batch(prompts: list[torch.Tensor]) -> list[Any]:
        return [decoder(prompts[0])]

    return evaluate_batched(batch, problems, tokenizer, n, seed, name, eos_id, mask_id, batch_size=1, progress=progress)


def evaluate_batched(
    decoder: Callable[[list[torch.Tensor]], Sequence[Any]],
    problems: Sequence[toy_task.Problem] | None = None,
    tokenizer=None,
    n: int = 200,
    seed: int = EVAL_SEED,
    name: str = "decoder",
    eos_id: int = toy_tok.EOS_ID,
    mask_id: int = toy_tok.MASK_ID,
    batch_size: int = 32,
    progress: bool = False,
) -> EvalResult:
    """Like ``evaluate`` for a decoder that takes a list of prompts (at most ``batch_size``) and
    returns one output per prompt, in order (each output as for ``evaluate``)."""
    tokenizer = tokenizer or toy_tok.build_tokenizer()
    problems = list(problems) if problems is not None else toy_task.make_problems(n, seed, "test")
    prompts = [torch.tensor(toy_tok.encode(tokenizer, p.prompt), dtype=torch.long) for p in problems]
    outputs, correct, traces, nfes = [], [], [], []
    t0 = time.perf_counter()
    for start in range(0, len(problems), batch_size):
        chunk = prompts[start : start + batch_size]
        results = list(decoder(chunk))
        if len(results) != len(chunk):
            raise ValueError(f"decoder returned {len(results)} outputs for {len(chunk)} prompts")
        for p, prompt, out in zip(problems[start : start + batch_size], chunk, results):
            ids, nfe = _split_output(prompt, out)
            text = toy_tok.decode_response(tokenizer, ids, eos_id, mask_id)
            outputs.append(text)
            correct.append(toy_task.check_answer(p, text))
            traces.append(toy_task.check_trace(p, text))
            if nfe is not None:
                nfes.append(nfe)
        if progress and sys.stderr.isatty():
            done = len(outputs)
            sys.stderr.write(f"\r  {name}: {done}/{len(problems)}, accuracy so far {sum(correct) / done:.3f}")
            sys.stderr.flush()
    if progress and sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
    k = max(1, len(problems))
    return EvalResult(
        name,
        len(problems),
        sum(correct) / k,
        sum(traces) / k,
        (sum(nfes) / len(nfes)) if nfes and len(nfes) == len(problems) else None,
        time.perf_counter() - t0,
        outputs,
        correct,
    )


def reference_decoder(
    model: ReferenceModel,
    policy: str,
    gen_length: int = 64,
    block_length: int = 32,
    threshold: float | None = 0.9,
    alg: str = "entropy",
    block_sizes: Sequence[int] = DREAM_BLOCK_SIZES,
    steps: int | None = None,
) -> Decoder:
    """A decoder running the float32 reference of ``policy`` on ``model``'s family: the policy's
    reference entry for that family (``blockbatch.policies``: ``reference.policies.generate`` for
    LLaDA, ``reference.dream``'s decoders for Dream), returning (generated ids, NFE).

    ``threshold`` None: one token per step (``steps = gen_length``). Where Dream's samplers apply
    (the family's ``SAMPLERS``), vanilla is the family's own sampler: ``steps`` forwards (default
    ``gen_length``) ranked by ``alg`` (the authors' names: ``maskgit_plus``, ``topk_margin``,
    ``entropy``, ``origin``), no blocks, no threshold. A multi-branch policy decodes with the branch
    sizes ``block_sizes``."""
    family = families.get(model.config.family)
    known = family.TOY_EVAL_POLICIES
    if policy not in known:
        raise ValueError(f"policy must be one of {known} for a {family.DISPLAY_NAME} model, got {policy!r}")
    kw: dict[str, Any] = dict(policy=policy, gen_length=gen_length, block_length=block_length, threshold=threshold)
    if family.SAMPLERS:
        if alg not in _ALG_OPTION:
            raise ValueError(f"alg must be one of {', '.join(_ALG_OPTION)}, got {alg!r}")
        kw.update(steps=steps or gen_length, alg=_ALG_OPTION[alg])
    else:
        kw.update(steps=gen_length if threshold is None else None)
    if policy_registry.get(policy).MULTI_BRANCH:
        kw.update(block_sizes=tuple(block_sizes))
    options = DecodeOptions(**kw)

    def decode(prompt: torch.Tensor):
        row, nfe = policy_registry.reference(model, prompt, options, family.NAME)
        return row[prompt.numel() :], nfe

    return decode


def policy_threshold(policy: str, threshold: float) -> float | None:
    """The commit rule the CLI uses: a policy whose bare spec commits without a threshold (vanilla:
    one token per step on LLaDA, Dream's own schedule) runs without one, the others with
    ``threshold``."""
    return None if policy_registry.get(policy).bench_options(0)["threshold"] is None else threshold


def evaluate_policies(
    model: ReferenceModel,
    policies: Sequence[str] | None = None,
    n: int = 200,
    gen_length: int = 64,
    block_length: int = 32,
    threshold: float = 0.9,
    seed: int = EVAL_SEED,
    tokenizer=None,
    progress: bool = False,
    alg: str = "entropy",
    block_sizes: Sequence[int] = DREAM_BLOCK_SIZES,
    steps: int | None = None,
) -> dict[str, EvalResult]:
    """Every policy of ``policies`` (default: all of the model's family) on the same problems."""
    problems = toy_task.make_problems(n, seed, "test")
    if policies is None:
        policies = policies_for(model.config.family)
    out = {}
    for policy in policies:
        dec = reference_decoder(
            model, policy, gen_length, block_length, policy_threshold(policy, threshold), alg, block_sizes, steps
        )
        out[policy] = evaluate(dec, problems, tokenizer, name=policy, progress=progress)
    return out


# --------------------------------------------------------------------------- confidence spread


def token_kind(problem: toy_task.Problem, index: int) -> str:
    """Kind of the reference response token at ``index`` (``task.response_kinds``, or ``eos``)."""
    kinds = toy_task.response_kinds(problem)
    return kinds[index] if index < len(kinds) else "eos"


@torch.no_grad()
def confidence_spread(
    model: ReferenceModel,
    problems: Sequence[toy_task.Problem],
    tokenizer=None,
    gen_length: int = 64,
    block_length: int = 32,
    threshold: float = 0.9,
) -> dict:
    """Confidence of each generated position at its first proposal, by kind of reference token.

    Decodes with the threshold rule (full forward each step, like ``vanilla`` with a threshold);
    a position's first proposal is the first forward in which its block is the current one.
    A Dream model's logits are shifted (position ``p`` read from output ``p - 1``).
    Returns, per kind, the count, the fraction with confidence < ``threshold`` and the mean
    confidence, plus the distribution of tokens committed per step.
    """
    tokenizer = tokenizer or toy_tok.build_tokenizer()
    cfg = model.config
    stats: dict[str, list[float]] = {kind: [] for kind in toy_task.RESPONSE_KINDS + ("eos",)}
    per_step: dict[int, int] = {}
    for p in problems:
        prompt = toy_tok.encode(tokenizer, p.prompt)
        lp = len(prompt)
        x = torch.full((lp + gen_length,), cfg.mask_token_id, dtype=torch.long)
        x[:lp] = torch.tensor(prompt)
        pos = torch.arange(lp + gen_length)
        for b in range(gen_length // block_length):
            s, e = lp + b * block_length, lp + (b + 1) * block_length
            first = True
            while bool((x[s:e] == cfg.mask_token_id).any()):
                logits = model.forward([x], [pos])[0]
                if cfg.shifted_logits:
                    logits = shift_rows(logits)
                logits = logits[s:e].double()
                conf, x0 = torch.softmax(logits, -1).max(-1)
                if first:
                    for i in range(s, e):
                        stats[token_kind(p, i - lp)].append(float(conf[i - s]))
                    first = False
                c = torch.where(x[s:e] == cfg.mask_token_id, conf, torch.full_like(conf, -math.inf))
                chosen = c >= threshold
                chosen[int(torch.argmax(c))] = True
                chosen &= torch.isfinite(c)
                x[s:e][chosen] = x0[chosen]
                k = int(chosen.sum())
                per_step[k] = per_step.get(k, 0) + 1
    out: dict[str, dict] = {
        kind: {
            "count": len(v),
            "frac_below_threshold": (sum(c < threshold for c in v) / len(v)) if v else None,
            "mean_conf": (sum(v) / len(v)) if v else None,
        }
        for kind, v in stats.items()
    }
    out["committed_per_step_hist"] = dict(sorted(per_step.items()))
    return out


# --------------------------------------------------------------------------- CLI


def format_table(results: dict[str, EvalResult]) -> str:
    lines = [f"{'policy':<10} {'n':>5} {'accuracy':>9} {'trace acc':>9} {'mean NFE':>9} {'wall s':>8}"]
    for r in results.values():
        nfe = "-" if r.mean_nfe is None else f"{r.mean_nfe:.2f}"
        lines.append(f"{r.name:<10} {r.n:>5} {r.accuracy:>9.3f} {r.trace_accuracy:>9.3f} {nfe:>9} {r.wall_s:>8.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m blockbatch.toy.evaluate", description=__doc__.split("\n\n")[0])
    evaluated = [f for f in CHECKPOINT_DIRS if policies_for(f)]  # the toys with float32 reference decoders
    where = ap.add_mutually_exclusive_group()
    where.add_argument(
        "--family",
        choices=evaluated,
        default=None,
        help=f"evaluate the shipped toy checkpoint of this family (default {evaluated[0]}; "
        + "; ".join(
            f"the {m.DISPLAY_NAME} toy decodes with the native policy {', '.join(m.POLICIES)}: "
            "blockbatch bench --model <its folder>"
            for m in families.REGISTRY.values()
            if not m.TOY_EVAL_POLICIES
        )
        + ")",
    )
    where.add_argument(
        "--checkpoint",
        default=None,
        help=f"checkpoint folder ({' or '.join(families.get(f).DISPLAY_NAME for f in evaluated)}: the family comes "
        "from its config.json)",
    )
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=EVAL_SEED)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument(
        "--policies",
        default=None,
        help="comma-separated (default: "
        + ", ".join(f"{','.join(policies_for(f))} for {families.get(f).DISPLAY_NAME}" for f in evaluated)
        + ")",
    )
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument(
        "--dream-alg",
        choices=ALGS,
        default="entropy",
        help="Dream vanilla: confidence of Dream's sampler (default entropy, the authors' harness)",
    )
    ap.add_argument(
        "--dream-steps",
        type=int,
        default=None,
        help="Dream vanilla: forwards of Dream's sampler (default --gen-length)",
    )
    ap.add_argument(
        "--block-sizes",
        default=",".join(map(str, DREAM_BLOCK_SIZES)),
        help="Dream blockbatch: branch block sizes (default %(default)s)",
    )
    ap.add_argument(
        "--confidence", action="store_true", help="also report the confidence at first proposal by kind of token"
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gen_length % args.block_length:
        ap.error(f"--block-length {args.block_length} must divide --gen-length {args.gen_length}")
    try:
        block_sizes = tuple(int(b) for b in args.block_sizes.split(","))
    except ValueError:
        ap.error(f"--block-sizes {args.block_sizes!r}: expected comma-separated integers")
    checkpoint = args.checkpoint or checkpoint_path(args.family or evaluated[0])
    if args.json:  # the one output-file rule (blockbatch.outputs), before the work
        try:
            check_output(args.json, "--json", protected=[("the checkpoint folder", checkpoint)])
        except OutputError as e:
            ap.error(str(e))
    ck = load_checkpoint(checkpoint)
    family = ck.config.family
    samplers = families.get(family).SAMPLERS  # Dream's: --dream-alg, --dream-steps apply
    known = policies_for(family)
    policies = known if args.policies is None else tuple(p.strip() for p in args.policies.split(",") if p.strip())
    for p in policies:
        if p not in known:
            ap.error(f"unknown policy {p!r} for a {family} checkpoint; choose from {', '.join(known)}")
    if args.dream_steps is not None and args.dream_steps <= 0:
        ap.error("--dream-steps must be positive")
    if any(policy_registry.get(p).MULTI_BRANCH for p in policies):
        for b in block_sizes:
            if b <= 0 or args.gen_length % b:
                ap.error(f"--block-sizes: {b} does not divide --gen-length {args.gen_length}")

    model = ReferenceModel.from_checkpoint(ck, dtype=torch.float32)
    tokenizer = ck.tokenizer or toy_tok.build_tokenizer()
    results = evaluate_policies(
        model,
        policies,
        args.n,
        args.gen_length,
        args.block_length,
        args.threshold,
        args.seed,
        tokenizer,
        progress=True,
        alg=args.dream_alg,
        block_sizes=block_sizes,
        steps=args.dream_steps,
    )
    if samplers:
        name = families.get(family).DISPLAY_NAME
        rules = (
            f"{name} reference decoders (float32): vanilla = {name}'s sampler, "
            f"{args.dream_steps or args.gen_length} steps, "
            f"alg {args.dream_alg}; prefix/dual = threshold {args.threshold}, blockbatch = block sizes "
            f"{','.join(map(str, block_sizes))}, threshold {args.threshold}"
        )
    else:
        rules = f"vanilla = 1 token/step, prefix/dual = threshold {args.threshold}"
    print(
        f"checkpoint {checkpoint} ({family}): {args.n} held-out problems (seed {args.seed}), gen {args.gen_length}, "
        f"block {args.block_length}; {rules}"
    )
    print(format_table(results))
    report: dict[str, Any] = {
        "checkpoint": checkpoint,
        "family": family,
        "n": args.n,
        "seed": args.seed,
        "gen_length": args.gen_length,
        "block_length": args.block_length,
        "threshold": args.threshold,
        "results": {k: dict(v.summary(), threshold=policy_threshold(k, args.threshold)) for k, v in results.items()},
    }
    if samplers:
        report.update(
            {
                "dream_alg": args.dream_alg,
                "dream_steps": args.dream_steps or args.gen_length,
                "block_sizes": list(block_sizes),
            }
        )
    if args.confidence:
        problems = toy_task.make_problems(args.n, args.seed, "test")
        spread = confidence_spread(model, problems, tokenizer, args.gen_length, args.block_length, args.threshold)
        report["confidence_at_first_proposal"] = spread
        print(f"confidence at first proposal (threshold {args.threshold}):")
        for kind in toy_task.RESPONSE_KINDS + ("eos",):
            s = spread[kind]
            if s["count"]:
                print(
                    f"  {kind:<13} n={s['count']:>6}  below threshold {s['frac_below_threshold']:.3f}  "
                    f"mean {s['mean_conf']:.3f}"
                )
        print(f"  tokens committed per step: {spread['committed_per_step_hist']}")
    if args.json:
        write_json_file(args.json, report, flag="--json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
