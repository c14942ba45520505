"""Single-branch decoding policies in plain Python (ALGORITHMS.md sections 1-3): the test oracle.

Policies: ``vanilla`` (full forward every step), ``prefix`` and ``dual`` (Fast-dLLM caches).
Commit rules: ``threshold`` (tau), ``fixed`` (LLaDA schedule from ``steps``), ``factor`` (f).
Temperature > 0 adds Gumbel-max noise in float64, drawn from a ``torch.Generator`` seeded with
``seed``: one ``rand([n, vocab], float64)`` per forward, ``n`` = the rows whose proposals are
used (the current block, in position order).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .. import contract
from .model import ReferenceModel

POLICIES = ("vanilla", "prefix", "dual")


@dataclasses.dataclass
class ReferenceResult:
    tokens: torch.Tensor  # [L] int64: prompt + generation
    nfe: int = 0
    nfe_full: int = 0
    nfe_block: int = 0
    committed_per_step: list[int] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0


def commit_rule(threshold: float | None, factor: float | None) -> str:
    if factor is not None:
        return "factor"
    return "threshold" if threshold is not None else "fixed"


def propose(logits: torch.Tensor, mask_id: int, temperature: float = 0.0,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposal and confidence (section 1). logits ``[n, V]`` -> x0 ``[n]`` int64, conf ``[n]`` float64.

    ``x0`` is the argmax (first index on ties) of the logits, or of Gumbel-perturbed float64
    logits when ``temperature > 0``, over every id but ``mask_id`` (a model may rank the mask
    first; committing it would never finish a block); ``conf`` is ``softmax(logits)[x0]`` in
    float64 over the whole vocabulary.
    """
    l64 = logits.double()
    if temperature > 0:
        noise = torch.rand(l64.shape, dtype=torch.float64, generator=generator)
        score = l64.exp() / (-torch.log(noise)) ** temperature
    else:
        score = logits.clone()
    score[:, mask_id] = float("-inf")
    x0 = torch.argmax(score, dim=-1)
    conf = torch.softmax(l64, dim=-1).gather(-1, x0[:, None])[:, 0]
    return x0, conf


def select_threshold(conf: torch.Tensor, tau: float) -> torch.Tensor:
    """Candidates with conf >= tau, plus the single most confident one (lowest index on ties).

    conf ``[n]`` holds ``-inf`` for non-candidates; returns a bool mask ``[n]``.
    """
    chosen = conf >= tau
    chosen[int(torch.argmax(conf))] = True
    return chosen & torch.isfinite(conf)


def _ranked(conf: torch.Tensor) -> torch.Tensor:
    """Candidate indices by descending confidence, ties by ascending index."""
    order = torch.sort(conf, descending=True, stable=True).indices
    return order[torch.isfinite(conf[order])]


def select_fixed(conf: torch.Tensor, k: int) -> torch.Tensor:
    chosen = torch.zeros_like(conf, dtype=torch.bool)
    chosen[_ranked(conf)[:k]] = True
    return chosen


def select_factor(conf: torch.Tensor, f: float) -> torch.Tensor:
    """Fast-dLLM's dynamic rule: rank r (1-based) needs conf >= 1 - f/(r+1); see ALGORITHMS.md 2."""
    ranked = _ranked(conf)
    n = len(ranked)
    take = n
    for r in range(2, n + 1):
        if not conf[ranked[r - 1]] >= 1.0 - f / (r + 1):
            take = n if r == n else r - 1
            break
    chosen = torch.zeros_like(conf, dtype=torch.bool)
    chosen[ranked[:take]] = True
    return chosen


def fixed_schedule(masks: int, steps_per_block: int) -> list[int]:
    base, rem = divmod(masks, steps_per_block)
    return [base + (1 if i < rem else 0) for i in range(steps_per_block)]


_D = contract.defaults_for("dual")  # the table's defaults


def generate(model: ReferenceModel, prompt: torch.Tensor, gen_length: int, block_length: int,
             policy: str = _D["policy"], steps: int | None = _D["steps"], threshold: float | None = _D["threshold"],
             factor: float | None = _D["factor"], temperature: float = _D["temperature"], seed: int = _D["seed"],
             stop_on_eos: bool = _D["stop_on_eos"]) -> ReferenceResult:
    """Decode one prompt (``[Lp]`` int64) with a single-branch policy; returns the whole canvas.

    ``steps`` (total over the generation) drives the fixed schedule; the threshold and factor
    rules ignore it. Blocks are aligned at the prompt end; every block loops until it holds no
    mask (checked before each step).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    cfg = model.config
    mask_id, eos_id = cfg.mask_token_id, cfg.eos_token_id
    rule = commit_rule(threshold, factor)
    num_blocks = gen_length // block_length
    steps_per_block = (steps // num_blocks) if rule == "fixed" else 0
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    start_time = time.perf_counter()

    lp = prompt.numel()
    L = lp + gen_length
    x = torch.full((L,), mask_id, dtype=torch.long)
    x[:lp] = prompt
    positions = torch.arange(L)
    res = ReferenceResult(tokens=x)
    kv = model.new_kv(1, L) if policy != "vanilla" else None

    def commit(logits_block: torch.Tensor, s: int, e: int, step_in_block: int, schedule: list[int]) -> None:
        x0, conf = propose(logits_block, mask_id, temperature, generator)
        cand = x[s:e] == mask_id
        conf = torch.where(cand, conf, torch.full_like(conf, float("-inf")))
        if rule == "threshold":
            chosen = select_threshold(conf, threshold)
        elif rule == "factor":
            chosen = select_factor(conf, factor)
        else:
            chosen = select_fixed(conf, schedule[step_in_block])
        x[s:e][chosen] = x0[chosen]
        res.committed_per_step.append(int(chosen.sum()))

    for block in range(num_blocks):
        s, e = lp + block * block_length, lp + (block + 1) * block_length
        schedule = fixed_schedule(int((x[s:e] == mask_id).sum()), steps_per_block) if rule == "fixed" else []
        step = 0
        while bool((x[s:e] == mask_id).any()):
            if policy == "vanilla" or step == 0:
                logits = model.forward([x], [positions], kv, "full")[0][s:e]
                res.nfe_full += 1
            elif policy == "dual":
                logits = model.forward([x[s:e]], [positions[s:e]], kv, "dual")[0]
                res.nfe_block += 1
            else:  # prefix: block + whole suffix against the frozen prefix [0, s)
                logits = model.forward([x[s:]], [positions[s:]], kv, "prefix", prefix_lens=[s])[0][: e - s]
                res.nfe_block += 1
            commit(logits, s, e, step, schedule)
            step += 1
        if stop_on_eos and bool((x[lp:e] == eos_id).any()):
            x[e:] = eos_id
            break
    res.nfe = res.nfe_full + res.nfe_block
    res.wall_s = time.perf_counter() - start_time
    return res
