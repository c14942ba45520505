"""Proposals of the two kinds the families use (ALGORITHMS.md 1 and 5.2): the oracle's own copy.

``propose``: argmax (or Gumbel-max in float64) without the mask id, softmax confidence in float64
(LLaDA). ``sample_tokens``: Dream's sampler (temperature, top-p, top-k, softmax in the logits'
dtype; argmax with the mask id included, or a draw; confidence by ``alg``).
"""

from __future__ import annotations

import math

import torch

ALGS = ("maskgit_plus", "topk_margin", "entropy", "origin")
ENTROPY_EPS = 1e-10


def propose(
    logits: torch.Tensor, mask_id: int, temperature: float = 0.0, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
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


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter as Dream applies it: keep the smallest prefix of the sorted vocabulary whose
    probability mass reaches ``top_p`` (the token that crosses it is kept); the rest get the
    dtype's lowest finite value."""
    ordered, order = torch.sort(logits, descending=True)
    mass = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1)
    drop = mass > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, drop)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def _filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    kth = torch.topk(logits, min(top_k, logits.size(-1)))[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def sample_tokens(
    logits: torch.Tensor,
    alg: str,
    temperature: float = 0.0,
    g: torch.Generator | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    vocab_limit: int | None = None,
):
    """Dream's proposal (its ``sample_tokens``) over the last dimension: (confidence, token).

    Order as in Dream: temperature scaling, top-p, top-k, softmax (float32 for float32 logits);
    token = argmax (``Tensor.max``, the mask id included) or a draw when ``temperature > 0``;
    confidence = its probability (``maskgit_plus``), top-1 minus top-2 probability
    (``topk_margin``) or ``sum(p * log(p + 1e-10))`` (``entropy``: minus the entropy).

    ``vocab_limit``: only ids below it are proposed (the ids the tokenizer can produce); the
    softmax and the confidences still cover the whole vocabulary, so wherever the authors' argmax
    is such an id the result is theirs.
    """
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = _filter_top_p(logits, top_p)
    if top_k is not None:
        logits = _filter_top_k(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    pick = probs
    if vocab_limit is not None and vocab_limit < probs.shape[-1]:
        pick = probs.clone()
        pick[..., vocab_limit:] = 0.0 if temperature > 0 else -1.0
    if temperature > 0:
        flat = pick.reshape(-1, probs.shape[-1])
        x0 = torch.multinomial(flat, 1, generator=g).reshape(probs.shape[:-1])
        conf = torch.gather(probs, -1, x0[..., None]).squeeze(-1)
    else:
        conf, x0 = pick.max(dim=-1)
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif alg == "entropy":
        conf = torch.sum(probs * torch.log(probs + ENTROPY_EPS), dim=-1)
    return conf, x0


MASK_PENALTY = -1e4  # BlockBatch-Dream writes this into the mask id's logit before ranking


def topk_propose(logits: torch.Tensor, mask_id: int, vocab_limit: int | None = None):
    """BlockBatch-Dream's proposal (ALGORITHMS.md 5.4): logits ``[n, V]`` -> (token ``[n]``, confidence
    ``[n]``). The mask id's logit becomes ``MASK_PENALTY``; token = ``torch.topk(k=1)`` (ids at or above
    ``vocab_limit`` never win); confidence = its float32 softmax probability over the whole vocabulary."""
    lg = logits.float().clone()
    lg[:, mask_id] = MASK_PENALTY
    ranked = lg
    if vocab_limit is not None and vocab_limit < lg.shape[-1]:
        ranked = lg.clone()
        ranked[:, vocab_limit:] = -math.inf
    _, pred = torch.topk(ranked, k=1, dim=-1)
    conf = torch.gather(torch.softmax(lg, dim=-1), -1, pred).squeeze(-1)
    return pred.squeeze(-1), conf
