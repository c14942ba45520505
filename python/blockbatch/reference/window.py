"""Window-Diffusion (policy ``window``, ALGORITHMS.md 13) in plain PyTorch: the test oracle.

LLaDA: the generation is one block decoded in ``steps`` steps with LLaDA's fixed per-step counts
(``gen_length // steps`` each, one more for the first ``gen_length % steps``). Steps run in phases
of ``refresh_interval``:

* a phase's first step is a full forward over the canvas that writes every position's K/V into
  the cache and commits the step's count among all masks by confidence; right after its commit
  the phase's key window is fixed: every non-mask position plus the first ``window_tokens`` masks;
* every other step is pruned: the active positions only (the first ``active_tokens`` masks, plus
  the positions the phase's full step committed for its first pruned step, then the positions its
  pruned steps committed) go through the layers at their absolute positions, each layer writing
  their K/V into the cache before attending the window; the step commits its count among the
  active masks.

Ties decide tokens, so the selection follows the authors' code exactly: proposal = argmax of the
logits (first index of the maximum; ids at or above ``vocab_limit`` never; the mask id is not
excluded), confidence = its float32 softmax probability, and ``torch.topk`` (CPU) over the vector
they rank: the whole canvas (``-inf`` where no mask) at a full step, the active positions in
ascending order (``-inf`` where no mask) at a pruned step. With ``temperature > 0`` the proposal
is the argmax of their Gumbel-perturbed float64 logits, the draws from a generator seeded with
``seed`` (their ``torch.rand_like`` on the global generator, seeded the same way).
"""

from __future__ import annotations

import dataclasses

import torch

from .model import ReferenceModel


@dataclasses.dataclass
class WindowResult:
    tokens: torch.Tensor  # [L] int64: prompt + generation
    nfe: int = 0
    nfe_full: int = 0
    nfe_pruned: int = 0
    pruned_key_tokens: int = 0
    committed_per_step: list[int] = dataclasses.field(default_factory=list)
    query_tokens_per_step: list[int] = dataclasses.field(default_factory=list)


def schedule(gen_length: int, steps: int) -> list[int]:
    """LLaDA's per-step counts over one block of ``gen_length`` masks: the remainder first."""
    return [gen_length // steps + (1 if i < gen_length % steps else 0) for i in range(steps)]


def _first_masks(x: torch.Tensor, mask_id: int, n: int) -> torch.Tensor:
    """Bool ``[L]``: the first ``n`` masked positions."""
    is_mask = x == mask_id
    return is_mask & (torch.cumsum(is_mask.long(), 0) <= n)


def _propose(
    logits: torch.Tensor, vocab_limit: int | None, temperature: float, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax among the ids below vocab_limit, its float32 softmax probability). temperature > 0:
    the argmax of the authors' Gumbel-perturbed float64 logits ``exp(l) / (-log u)^temperature``,
    ``u`` one uniform float64 draw per logit of the step's rows from ``g``."""
    lg = logits.float()
    score = lg
    if temperature > 0:
        u = torch.rand(lg.shape, dtype=torch.float64, generator=g)
        score = lg.double().exp() / (-torch.log(u)) ** temperature
    x0 = score[:, :vocab_limit].argmax(-1) if vocab_limit is not None else score.argmax(-1)
    conf = torch.softmax(lg, -1).gather(-1, x0[:, None])[:, 0]
    return x0, conf


def select(conf: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` entries a step commits: ``torch.topk``'s indices (its order among equal values, as
    in the authors' code; the tests swap this to show that the order decides tokens)."""
    return torch.topk(conf, k).indices


def window_generate(
    model: ReferenceModel,
    prompt: torch.Tensor,
    gen_length: int,
    steps: int,
    window_tokens: int,
    active_tokens: int,
    refresh_interval: int,
    mask_id: int,
    vocab_limit: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
) -> WindowResult:
    """Window-Diffusion on a LLaDA model (module docstring); ``prompt``: int64 ``[P]``."""
    P = prompt.numel()
    L = P + gen_length
    x = torch.full((L,), mask_id, dtype=torch.long)
    x[:P] = prompt
    counts = schedule(gen_length, steps)
    if max(counts) > active_tokens:
        raise ValueError(f"active_tokens = {active_tokens} is below a step's count {max(counts)}")
    kv = model.new_kv(1, L)
    g = torch.Generator().manual_seed(seed)
    res = WindowResult(tokens=x)
    everything = torch.arange(L)
    window = active = everything
    phase_commits = pruned_commits = torch.zeros(L, dtype=torch.bool)
    for i, k in enumerate(counts):
        full = i % refresh_interval == 0
        if full:
            positions = everything
            [logits] = model.forward([x], [positions], kv, "full")
        else:
            positions = active
            [logits] = model.forward([x[positions]], [positions], kv, "dual", key_positions=[window])
        x0, p = _propose(logits, vocab_limit, temperature, g)
        conf = torch.where(x[positions] == mask_id, p, torch.tensor(float("-inf")))
        sel = select(conf, k)
        picked = positions[sel]
        x[picked] = x0[sel]
        committed = torch.zeros(L, dtype=torch.bool)
        committed[picked] = True
        if full:
            res.nfe_full += 1
            window = ((x != mask_id) | _first_masks(x, mask_id, window_tokens)).nonzero()[:, 0]
            phase_commits = committed  # the first pruned step computes these too
            pruned_commits = torch.zeros(L, dtype=torch.bool)
        else:
            res.nfe_pruned += 1
            res.pruned_key_tokens += window.numel()
            pruned_commits |= committed
            phase_commits = pruned_commits.clone()
        active = (_first_masks(x, mask_id, active_tokens) | phase_commits).nonzero()[:, 0]
        res.committed_per_step.append(int((x0[sel] != mask_id).sum()))
        res.query_tokens_per_step.append(positions.numel())
    res.nfe = res.nfe_full + res.nfe_pruned
    return res


def reference_entry(model: ReferenceModel, prompt: torch.Tensor, o, vocab_limit: int | None = None):
    """``policies.window.REFERENCE["llada"]``: (canvas row, forwards) for DecodeOptions ``o``."""
    r = window_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        steps=o.steps or o.gen_length,
        window_tokens=o.window_tokens,
        active_tokens=o.active_tokens,
        refresh_interval=o.refresh_interval,
        mask_id=model.config.mask_token_id,
        vocab_limit=vocab_limit,
        temperature=o.temperature,
        seed=o.seed,
    )
    return r.tokens, r.nfe
