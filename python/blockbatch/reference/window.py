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
from .policies import timestep_count
from .proposals import sample_tokens


@dataclasses.dataclass
class WindowResult:
    tokens: torch.Tensor  # [L] int64: prompt + generation
    nfe: int = 0
    nfe_full: int = 0
    nfe_pruned: int = 0
    pruned_key_tokens: int = 0
    committed_per_step: list[int] = dataclasses.field(default_factory=list)
    query_tokens_per_step: list[int] = dataclasses.field(default_factory=list)
    key_tokens_per_step: list[int] = dataclasses.field(default_factory=list)


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
            keys = window.numel()  # the window this step attended (fixed at the phase's start)
            res.pruned_key_tokens += keys
            pruned_commits |= committed
            phase_commits = pruned_commits.clone()
        active = (_first_masks(x, mask_id, active_tokens) | phase_commits).nonzero()[:, 0]
        res.committed_per_step.append(int((x0[sel] != mask_id).sum()))
        res.query_tokens_per_step.append(positions.numel())
        res.key_tokens_per_step.append(L if full else keys)
    res.nfe = res.nfe_full + res.nfe_pruned
    return res


def reference_entry(model: ReferenceModel, prompt: torch.Tensor, o, vocab_limit: int | None = None):
    """``policies.window.REFERENCE["llada"]``: (canvas row, forwards) for DecodeOptions ``o``."""
    r = window_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        steps=o.steps or o.gen_length,
        window_tokens=o.resolved("window_tokens", "llada"),
        active_tokens=o.active_tokens,
        refresh_interval=o.refresh_interval,
        mask_id=model.config.mask_token_id,
        vocab_limit=vocab_limit,
        temperature=o.temperature,
        seed=o.seed,
    )
    return r.tokens, r.nfe


# ------------------------------------------------------------------------------------------ Dream


class WindowRefused(ValueError):
    """A setting the authors' Dream decoder cannot run (``param``: the option to change)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclasses.dataclass
class DreamWindowResult(WindowResult):
    length: int = 0  # the canvas after the early_stop cut (prompt + generation up to the first EOS)


def _nth_mask_end(is_mask: torch.Tensor, n: int) -> int:
    """The position of the ``n + 1``-th mask (the end of a span holding the first ``n`` masks), or the
    canvas length when there are at most ``n``."""
    where = is_mask.nonzero()[:, 0]
    return int(where[n]) if where.numel() > n else is_mask.numel()


def dream_window_generate(
    model: ReferenceModel,
    prompt: torch.Tensor,
    gen_length: int,
    steps: int,
    window_tokens: int,
    active_tokens: int,
    refresh_interval: int,
    mask_id: int,
    eos_id: int,
    slide_window: bool = False,
    early_stop: bool = False,
    eps: float = 1e-3,
    alg_temp: float = 0.0,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    vocab_limit: int | None = None,
    seed: int = 0,
) -> DreamWindowResult:
    """Window-Diffusion on a Dream model (ALGORITHMS.md 13.3; the semantics of the authors'
    ``nearest_sample_fast_v2_cache``). Dream reads canvas position ``p`` from output ``p - 1`` (the
    forward's first output keeps its own row). Steps run in phases of ``refresh_interval``:

    * a full step (a phase's first, and every step once early_stop has cut the canvas) forwards the
      canvas prefix of length ``decoded + min(window_tokens, masks)`` (everything after it dropped)
      with full attention, writing its K/V; it fixes the active span ``[s, e)``: ``s`` the first mask,
      ``e`` the position of the ``active_tokens + 1``-th mask (the canvas end if fewer), and commits
      exactly one token, Dream's proposal for position ``s``;
    * a pruned step forwards the span only (with ``slide_window``, ``e`` is recomputed from the
      current masks; ``s`` stays), writing the span's K/V, attending the cache rows ``[0, K)`` (K the
      phase's prefix), and commits ``int(masks * (1 - t[i+1] / t[i]))`` of the span's masks in float32
      over Dream's timesteps ``linspace(1, eps, steps + 1)`` (every mask at the last step; one with
      ``early_stop``), ranked by minus the entropy of the filtered distribution with ``torch.topk``
      over the span (``-inf`` where no mask), or drawn from ``softmax(confidence / alg_temp)``;
    * ``early_stop``: after a pruned step's commit, the canvas is cut after its first EOS and every
      later step is a full one.

    The loop ends after ``steps`` steps or when no mask is left (a full step with none left does not
    run). Raises ``WindowRefused`` where the authors' code cannot run: a span past the kept prefix,
    a count above the span's masks.
    """
    P = prompt.numel()
    x = torch.full((P + gen_length,), mask_id, dtype=torch.long)
    x[:P] = prompt
    n = x.numel()  # the canvas length (cut by early_stop)
    kv = model.new_kv(1, n)
    g = torch.Generator().manual_seed(seed)
    ts = torch.linspace(1, eps, steps + 1)
    res = DreamWindowResult(tokens=x)
    reach_eos = False
    s = e = K = 0
    for i in range(steps):
        is_mask = x[:n] == mask_id
        masks = int(is_mask.sum())
        if masks == 0:
            break
        if i % refresh_interval == 0 or reach_eos:
            K = n - masks + min(window_tokens, masks)
            s = int(is_mask.nonzero()[0, 0])
            e = _nth_mask_end(is_mask, active_tokens)
            if e > K:
                raise WindowRefused(
                    "active_tokens", f"at step {i} the active span [{s}, {e}) passes the kept prefix [0, {K})"
                )
            [logits] = model.forward([x[:K]], [torch.arange(K)], kv, "full")
            rows = [max(q - 1, 0) for q in range(s, e) if is_mask[q]]
            _, x0 = sample_tokens(logits[rows], "entropy", temperature, g, top_p, top_k, vocab_limit)
            x[s] = x0[0]
            res.nfe_full += 1
            res.committed_per_step.append(int(x0[0] != mask_id))
            res.query_tokens_per_step.append(K)
            res.key_tokens_per_step.append(K)
            continue
        if slide_window:
            e = _nth_mask_end(is_mask, active_tokens)
            if e > K:
                raise WindowRefused(
                    "window_tokens", f"at step {i} the sliding span [{s}, {e}) passes the kept prefix [0, {K})"
                )
        span = torch.arange(s, e)
        [logits] = model.forward([x[s:e]], [span], kv, "dual", key_positions=[torch.arange(K)])
        transfer = is_mask[s:e]
        rows = [max(j - 1, 0) for j in range(e - s) if transfer[j]]
        conf, x0 = sample_tokens(logits[rows], "entropy", temperature, g, top_p, top_k, vocab_limit)
        k = 1 if early_stop else timestep_count(ts, i, masks)
        res.nfe_pruned += 1
        res.pruned_key_tokens += K
        res.query_tokens_per_step.append(e - s)
        res.key_tokens_per_step.append(K)
        committed = 0
        if k > 0:
            if k > int(transfer.sum()):
                raise WindowRefused(
                    "active_tokens" if slide_window else "slide_window",
                    f"at step {i} the step commits {k} tokens but its active span [{s}, {e}) holds "
                    f"{int(transfer.sum())} masks",
                )
            full = torch.full((1, e - s), float("-inf"))
            full[0, transfer] = conf
            if alg_temp:
                picked = torch.multinomial(torch.softmax(full / alg_temp, -1), k, generator=g)[0]
            else:
                picked = select(full, k)[0]
            proposal = torch.full((e - s,), mask_id, dtype=torch.long)
            proposal[transfer] = x0
            x[s + picked] = proposal[picked]
            committed = int((proposal[picked] != mask_id).sum())
            if early_stop:
                eos = (x[:n] == eos_id).nonzero()
                if eos.numel():
                    n = int(eos[0, 0]) + 1
                    reach_eos = True
        res.committed_per_step.append(committed)
    res.nfe = res.nfe_full + res.nfe_pruned
    res.length = n
    x[max(n, P) :] = eos_id  # the cut generation ends at its EOS (a cut inside the prompt keeps the prompt)
    return res


def dream_reference_entry(model: ReferenceModel, prompt: torch.Tensor, o, vocab_limit: int | None = None):
    """``policies.window.REFERENCE["dream"]``: (canvas row, forwards) for DecodeOptions ``o`` (after the
    early_stop cut, the canvas holds EOS, as the engine's)."""
    c = model.config
    r = dream_window_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        steps=o.steps or o.gen_length,
        window_tokens=o.resolved("window_tokens", "dream"),
        active_tokens=o.active_tokens,
        refresh_interval=o.refresh_interval,
        mask_id=c.mask_token_id,
        eos_id=c.eos_token_id,
        slide_window=o.resolved("slide_window", "dream"),
        early_stop=o.early_stop,
        eps=o.eps,
        alg_temp=o.alg_temp,
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        vocab_limit=vocab_limit,
        seed=o.seed,
    )
    return r.tokens, r.nfe
