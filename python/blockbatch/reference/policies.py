"""Single-branch decoding policies in plain Python (ALGORITHMS.md sections 1-3, 5.2, 5.3): the test oracle.

Policies: ``vanilla`` (full forward every step), ``prefix`` and ``dual`` (Fast-dLLM caches), for
every family, over the rules table ``RULES`` (the oracle's own, written from the spec; the C++
has its rows in the tables of csrc/decode/policies/). LLaDA's commit rules: ``threshold`` (tau), ``fixed``
(LLaDA schedule from ``steps``), ``factor`` (f); temperature > 0 adds Gumbel-max noise in float64,
drawn from a ``torch.Generator`` seeded with ``seed``: one ``rand([n, vocab], float64)`` per
forward, ``n`` = the rows whose proposals are used (the current block, in position order).
Dream's: the timestep schedule of its vanilla sampler, and the threshold rule with its block-start
seed in the cached policies (``dream.dream_vanilla`` / ``dream.dream_cached`` name them).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .. import contract
from .model import ReferenceModel
from .proposals import ALGS, propose, sample_tokens

POLICIES = ("vanilla", "prefix", "dual")


@dataclasses.dataclass(frozen=True)
class Rules:
    """Where two families' decoders differ (ALGORITHMS.md 3, 4 and 5), one row per family. The same
    rules as the native policies' tables (csrc/decode/policies/) in meaning, written again here from the spec."""

    logit_shift: int  # canvas position p reads model output p - logit_shift (a window's first row: its own)
    timestep: bool  # vanilla: no blocks, ``steps`` forwards on Dream's timestep schedule
    seed: bool  # a full forward writes one token, the window's first mask (else: commits by the rule)
    readout: str  # "argmax": ``propose`` and the select_* rules | "topk": Dream's, in torch.topk's tie order
    # BlockBatch (section 4; Dream's differences in 5.4)
    map_accumulate: bool  # map entries accumulate until a seed clears them (else: a step replaces its window's)
    gate_inclusive: bool  # a merge writes a token rated >= merge_gate (else >)
    exit: str  # "eos_probability": after block steps (4.6) | "decoded_progress_block": after every phase
    refresh_clock: str  # "blocks": completed blocks since the last full forward | "tokens": frontier progress
    nfe_winner: bool  # the paper's NFE counts the winner's forwards (else every forward)
    eos_cut: bool  # with stop_on_eos a row's generation ends at its first EOS (windows, counts, merges)
    count_from_row: bool  # ``decoded`` is recounted from the row (merged tokens count; else commits and syncs)


RULES = {
    "llada": Rules(
        logit_shift=0,
        timestep=False,
        seed=False,
        readout="argmax",
        map_accumulate=False,
        gate_inclusive=False,
        exit="eos_probability",
        refresh_clock="blocks",
        nfe_winner=True,
        eos_cut=False,
        count_from_row=False,
    ),
    "dream": Rules(
        logit_shift=1,
        timestep=True,
        seed=True,
        readout="topk",
        map_accumulate=True,
        gate_inclusive=True,
        exit="decoded_progress_block",
        refresh_clock="tokens",
        nfe_winner=False,
        eos_cut=True,
        count_from_row=True,
    ),
}


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


def shift_rows(logits: torch.Tensor) -> torch.Tensor:
    """The shift over the rows of one forward: row ``i`` takes output ``i - 1``, row 0 its own."""
    return torch.cat([logits[:1], logits[:-1]], dim=0)


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


def timestep_count(timesteps: torch.Tensor, i: int, masks: int) -> int:
    """Dream's count at step ``i`` of ``timesteps = linspace(1, eps, steps + 1)`` (float32):
    ``int(masks * (1 - t[i+1] / t[i]))``, the product in float32 and truncated; every mask at the last step."""
    if i == timesteps.numel() - 2:
        return masks
    return int(masks * (1 - timesteps[i + 1] / timesteps[i]))


def generate(
    model: ReferenceModel,
    prompt: torch.Tensor,
    gen_length: int,
    block_length: int,
    policy: str = _D["policy"],
    steps: int | None = _D["steps"],
    threshold: float | None = _D["threshold"],
    factor: float | None = _D["factor"],
    temperature: float = _D["temperature"],
    seed: int = _D["seed"],
    stop_on_eos: bool = _D["stop_on_eos"],
    family: str = "llada",
    alg: str = "entropy",
    alg_temp: float = 0.0,
    eps: float = 1e-3,
    top_p: float | None = None,
    top_k: int | None = None,
    vocab_limit: int | None = None,
) -> ReferenceResult:
    """Decode one prompt (``[Lp]`` int64) with a single-branch policy; returns the whole canvas.

    Blocks are aligned at the prompt end and decoded left to right; a block loops until it holds
    no mask (checked before each step), except where the family's rules say otherwise: Dream's
    cached block start (``Rules.seed``) is always followed by a window step, and Dream's vanilla
    (``Rules.timestep``) is one block of ``steps`` forwards (None: ``gen_length``). LLaDA:
    ``steps`` (total over the generation) drives the fixed schedule; the threshold and factor rules
    ignore it. Dream: ``alg``, ``alg_temp``, ``eps``, ``top_p``, ``top_k`` and ``vocab_limit`` (only
    ids below it are proposed) are its sampler's; the cached policies commit by ``threshold``.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    rules = RULES[family]
    cfg = model.config
    mask_id, eos_id = cfg.mask_token_id, cfg.eos_token_id
    timestep = policy == "vanilla" and rules.timestep
    seeded = policy != "vanilla" and rules.seed
    lp = prompt.numel()
    if rules.logit_shift and lp == 0:
        raise ValueError(f"{family} decoding needs a non-empty prompt (position p reads output p - 1)")
    rule = commit_rule(threshold, factor)
    timestep_steps = 0  # timestep: the forwards of the schedule (steps, None: gen_length)
    if timestep:
        timestep_steps = gen_length if steps is None else steps
        if alg not in ALGS:
            raise ValueError(f"alg must be one of {ALGS}, got {alg!r}")
        if timestep_steps <= 0:
            raise ValueError("steps must be positive")
        block_length, rule = gen_length, "timestep"
        timesteps = torch.linspace(1, eps, timestep_steps + 1)
    elif gen_length % block_length:
        raise ValueError(f"gen_length {gen_length} is not a multiple of block_length {block_length}")
    num_blocks = gen_length // block_length
    steps_per_block = 0
    if rule == "fixed":
        assert steps is not None  # the fixed schedule runs over steps (the options table requires them)
        steps_per_block = steps // num_blocks
    generator = torch.Generator().manual_seed(seed) if temperature > 0 or timestep else None
    start_time = time.perf_counter()

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
            assert threshold is not None  # commit_rule's "threshold"
            chosen = select_threshold(conf, threshold)
        elif rule == "factor":
            assert factor is not None  # commit_rule's "factor"
            chosen = select_factor(conf, factor)
        else:
            chosen = select_fixed(conf, schedule[step_in_block])
        x[s:e][chosen] = x0[chosen]
        res.committed_per_step.append(int(chosen.sum()))

    def commit_timestep(logits: torch.Tensor, i: int) -> None:
        """Dream's step ``i``: ``int(m * (1 - t[i+1] / t[i]))`` of the ``m`` masks (float32 product,
        truncated; every mask at the last step), the top ones by confidence (``torch.topk`` over the
        canvas, ``-inf`` off the masks) or drawn from ``softmax(conf / alg_temp)``; ``origin`` unmasks
        each mask with probability ``1 - t[i+1] / t[i]`` (1 at the last step). The mask id is not
        excluded (as in Dream): a committed position may stay masked."""
        xr, logits = x[None], logits[None]
        mask_index = xr == mask_id
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if alg == "origin":
            p_transfer = 1 - s / t if i < timestep_steps - 1 else 1
            x0 = torch.full_like(xr[mask_index], mask_id)
            chosen = torch.rand(*x0.shape, generator=generator) < p_transfer
            _, x0[chosen] = sample_tokens(mask_logits[chosen], alg, temperature, generator, top_p, top_k, vocab_limit)
            xr[mask_index] = x0.clone()
            res.committed_per_step.append(int(chosen.sum()))
            return
        conf, x0 = sample_tokens(mask_logits, alg, temperature, generator, top_p, top_k, vocab_limit)
        k = timestep_count(timesteps, i, int(mask_index.sum()))
        full = torch.full_like(xr, -torch.inf, dtype=logits.dtype)
        full[mask_index] = conf
        if k > 0:
            if alg_temp:
                picked = torch.multinomial(torch.softmax(full / alg_temp, dim=-1), num_samples=k, generator=generator)
            else:
                _, picked = torch.topk(full, k)
            proposal = torch.full_like(xr, mask_id)
            proposal[mask_index] = x0.clone()
            xr[0, picked[0]] = proposal[0, picked[0]]
        res.committed_per_step.append(max(k, 0))

    def commit_seed(logits: torch.Tensor, s: int) -> None:
        """Dream's cached block start: position ``s`` from the full forward's argmax (over the whole
        vocabulary, mask id included)."""
        _, x0 = sample_tokens(logits[None], "maskgit_plus", top_p=top_p, top_k=top_k, vocab_limit=vocab_limit)
        x[s] = x0[0, s]
        res.committed_per_step.append(1)

    def commit_window(logits: torch.Tensor, s: int, e: int) -> None:
        """Dream's Fast-dLLM window: among the block's masks (``-inf`` elsewhere, suffix included) the
        ``torch.topk`` first is committed, plus every other one with confidence ``>= threshold``."""
        end = s + logits.shape[0]
        mask_index = (x[s:end] == mask_id)[None]
        conf, x0 = sample_tokens(
            logits[None][mask_index], "maskgit_plus", top_p=top_p, top_k=top_k, vocab_limit=vocab_limit
        )
        proposal = torch.full((1, end - s), mask_id, dtype=torch.long)
        proposal[mask_index] = x0.clone()
        full = torch.full((1, end - s), -torch.inf, dtype=logits.dtype)
        full[mask_index] = conf
        full[:, e - s :] = -torch.inf
        n = int((x[s:e] == mask_id).sum())
        top_conf, top_idx = torch.topk(full, n)
        take = torch.zeros((1, end - s), dtype=torch.bool)
        take[0, top_idx[0]] = True
        for r in range(1, n):
            assert threshold is not None  # Dream's cached decoders commit by threshold (the options table's rule)
            if top_conf[0, r] < threshold:
                take[0, top_idx[0, r]] = False
        x[s:end][take[0]] = proposal[0][take[0]]
        left = int((x[s:e] == mask_id).sum())
        res.committed_per_step.append(n - left)
        if left and left == n:  # the model proposed the mask id itself: the authors' loop would never end
            raise RuntimeError(f"no progress in block [{s}, {e}): the model proposes the mask id")

    for block in range(num_blocks):
        s, e = lp + block * block_length, lp + (block + 1) * block_length
        schedule = fixed_schedule(int((x[s:e] == mask_id).sum()), steps_per_block) if rule == "fixed" else []
        step = 0
        while step < timestep_steps if timestep else (seeded and step == 1) or bool((x[s:e] == mask_id).any()):
            if policy == "vanilla" or step == 0:
                out, out0 = model.forward([x], [positions], kv, "full")[0], 0
                res.nfe_full += 1
            elif policy == "dual":
                out, out0 = model.forward([x[s:e]], [positions[s:e]], kv, "dual")[0], s
                res.nfe_block += 1
            else:  # prefix: block + whole suffix against the frozen prefix [0, s)
                out, out0 = model.forward([x[s:]], [positions[s:]], kv, "prefix", prefix_lens=[s])[0], s
                res.nfe_block += 1
            if rules.logit_shift:
                out = shift_rows(out)
            if timestep:
                commit_timestep(out, step)
            elif seeded and step == 0:
                commit_seed(out, s)
            elif rules.readout == "topk":
                commit_window(out, s, e)
            else:
                commit(out[s - out0 : e - out0], s, e, step, schedule)
            step += 1
        if stop_on_eos and bool((x[lp:e] == eos_id).any()):
            x[e:] = eos_id
            break
    res.nfe = res.nfe_full + res.nfe_block
    res.wall_s = time.perf_counter() - start_time
    return res
