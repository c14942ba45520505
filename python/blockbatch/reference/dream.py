"""Float32 reference decoders for the Dream family (ALGORITHMS.md section 5, "Dream family").

Written from the semantics of the authors' Dream decoders (Laurence-Wu/BlockBatch
``dream/model/generation_utils.py``, ``dream/model/generation_utils_block.py`` and
``dream/generate_blockBatching_original_bulk.py``), not from their code. Three policies:

* ``dream_vanilla``: Dream's own sampler over the whole canvas (no blocks), ``steps`` full
  forwards, ``alg`` in ``maskgit_plus`` / ``topk_margin`` / ``entropy`` / ``origin``.
* ``dream_cached``: Fast-dLLM prefix or dual cache for Dream, threshold rule, with Dream's
  block-start rule (the block's first position is written from the block-start full forward).
* ``dream_blockbatch``: BlockBatch for Dream (probability floor 0.2, gate 0.5 with ``>=``, sync 8,
  refresh after 32 tokens of frontier progress, ``stop_on_eos=False`` by default).

Each is the family-neutral policy under Dream's row of ``policies.RULES`` (``policies.generate``,
``blockbatch.blockbatch_generate``); Dream's proposals (``sample_tokens``, the BlockBatch top-k
readout) are in ``proposals.py``. This module keeps Dream's defaults and its result shape.

Shift. The model (``ReferenceModel``) is unshifted; Dream reads canvas position ``p`` from the
output at ``p - 1``. Where each policy takes that output from differs (see the docs): the full
forwards and the Fast-dLLM windows shift their own output rows by one (the first row keeps its
own output, which is never used for a masked position), the BlockBatch block step feeds the
predecessor window ``[s-1, e-1)`` so that output ``j`` maps onto canvas ``s + j``.

Ties. Wherever the authors rank with ``torch.topk`` / ``torch.argmax`` / ``Tensor.max`` this code
makes the same call on a tensor of the same shape, so ties fall the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from .model import ReferenceModel
from .blockbatch import blockbatch_generate
from .policies import generate, shift_rows  # noqa: F401 (shift_rows: imported from here by tests)

PROB_FLOOR = 0.2  # BlockBatch-Dream probability map floor (strictly above)
MERGE_GATE = 0.5  # a merged token needs map probability >= gate (Dream uses >=, LLaDA >)
SYNC_GAP = 8
REFRESH_TOKENS = 32


@dataclasses.dataclass
class DreamResult:
    tokens: list[int]  # the canvas row returned (prompt + generation; cut after EOS on early exit)
    nfe: int  # forwards executed
    stats: dict = dataclasses.field(default_factory=dict)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.stats.get("prompt_len", 0) :]


# ------------------------------------------------------------------ single-branch policies


def _single(model: ReferenceModel, prompt: Sequence[int], gen_length: int, **kw) -> DreamResult:
    if len(prompt) == 0:
        raise ValueError("Dream decoding needs a non-empty prompt")
    r = generate(model, torch.as_tensor(list(prompt), dtype=torch.long), gen_length, family="dream", **kw)
    return DreamResult(
        r.tokens.tolist(), r.nfe, {"prompt_len": len(prompt), "nfe_full": r.nfe_full, "nfe_block": r.nfe_block}
    )


def dream_vanilla(
    model: ReferenceModel,
    prompt: Sequence[int],
    gen_length: int,
    steps: int,
    alg: str = "entropy",
    alg_temp: float = 0.0,
    eps: float = 1e-3,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int = 0,
    vocab_limit: int | None = None,
    stop_on_eos: bool = False,
) -> DreamResult:
    """Dream's sampler: ``steps`` full forwards over the whole canvas (no blocks); the rules are
    ``policies.generate``'s timestep schedule. Random draws come from a generator seeded with
    ``seed`` (the authors draw from torch's global one: seeding it with the same seed gives the
    same stream for ``origin``). NFE = steps."""
    return _single(
        model,
        prompt,
        gen_length,
        block_length=gen_length,
        policy="vanilla",
        steps=steps,
        alg=alg,
        alg_temp=alg_temp,
        eps=eps,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        vocab_limit=vocab_limit,
        threshold=None,
        stop_on_eos=stop_on_eos,
    )


def dream_cached(
    model: ReferenceModel,
    prompt: Sequence[int],
    gen_length: int,
    block_length: int = 32,
    threshold: float = 0.9,
    dual: bool = True,
    top_p: float | None = None,
    top_k: int | None = None,
    vocab_limit: int | None = None,
    stop_on_eos: bool = False,
) -> DreamResult:
    """Fast-dLLM prefix (``dual=False``) or dual cache for Dream, threshold rule (``policies.generate``
    with Dream's rules: the block start's full forward writes the block's first position, then at
    least one window step; the window's outputs are shifted by one inside the window).
    NFE = blocks + block steps. ``stop_on_eos`` (not in the authors' decoder): a block that holds
    EOS ends the decode, the rest of the canvas EOS."""
    return _single(
        model,
        prompt,
        gen_length,
        block_length=block_length,
        policy="dual" if dual else "prefix",
        threshold=threshold,
        top_p=top_p,
        top_k=top_k,
        vocab_limit=vocab_limit,
        stop_on_eos=stop_on_eos,
    )


# ---------------------------------------------------------------------------------- BlockBatch


def dream_blockbatch(
    model: ReferenceModel,
    prompt: Sequence[int],
    gen_length: int,
    block_sizes: Sequence[int] = (4, 8, 16, 32, 64),
    threshold: float = 0.9,
    merge_gate: float = MERGE_GATE,
    sync_gap: int = SYNC_GAP,
    refresh_tokens: int = REFRESH_TOKENS,
    prob_floor: float = PROB_FLOOR,
    stop_on_eos: bool = False,
    merge: bool = True,
    sync: bool = True,
    vocab_limit: int | None = None,
    sync_refresh: bool = False,
    fold_rows: bool = True,
    share_prompt_kv: bool = False,
    commit_rows: bool = False,
) -> DreamResult:
    """BlockBatch for Dream (ALGORITHMS.md section 5.4): ``blockbatch.blockbatch_generate`` under
    Dream's rules; NFE counts every forward executed; the row is cut after the winner's first EOS on
    an EOS exit. ``refresh_tokens=0`` never refreshes (the engine's meaning; the authors' default is
    32); ``merge`` / ``sync`` are the ablation switches; ``sync_refresh`` the variant of section 10.3;
    ``fold_rows``: the query-token log and ``folded_rows`` count a folding engine's refresh rows;
    ``share_prompt_kv``: every branch reads the prompt K/V of the first row each full forward feeds;
    ``commit_rows``: ``stats["commit_rows"]``, the logits row of each generated token of the row
    (``blockbatch_generate``'s, None after the first EOS on an EOS exit: filled, not read)."""
    prompt_ids = torch.as_tensor(list(prompt), dtype=torch.long)
    r = blockbatch_generate(
        model,
        prompt_ids,
        gen_length,
        block_sizes,
        threshold=threshold,
        merge_gate=merge_gate,
        sync_gap=sync_gap,
        refresh_tokens=refresh_tokens,
        refresh_mode="periodic",
        prob_floor=prob_floor,
        stop_on_eos=stop_on_eos,
        merge=merge,
        sync=sync,
        temperature=0.0,
        seed=0,
        sync_refresh=sync_refresh,
        fold_rows=fold_rows,
        share_prompt_kv=share_prompt_kv,
        family="dream",
        vocab_limit=vocab_limit,
        commit_rows=commit_rows,
    )
    tokens, lp = r.tokens.tolist(), prompt_ids.numel()
    if r.early_exit:
        tokens = tokens[: lp + tokens[lp:].index(model.config.eos_token_id) + 1]
    return DreamResult(
        tokens,
        r.nfe,
        {
            "prompt_len": lp,
            "nfe_init": r.nfe_init,
            "nfe_block": r.nfe_block,
            "nfe_refresh": r.nfe_refresh,
            "winner_block_size": r.winner_block_size,
            "exit_reason": r.exit_reason,
            "early_exit": r.early_exit,
            "folded_rows": r.folded_rows,
            "query_tokens_per_step": r.query_tokens_per_step,
            "branches": [
                {"block_size": b.block_size, "committed": b.committed, "merged": b.merged, "copied": b.copied}
                for b in r.branches
            ],
            **({"commit_rows": _cut_rows(r, len(tokens) - lp)} if commit_rows else {}),
        },
    )


def _cut_rows(r, kept: int) -> list:
    """A BlockBatch result's commit rows, None past the ``kept`` tokens of its (cut) row."""
    assert r.commit_rows is not None
    return [row if j < kept else None for j, row in enumerate(r.commit_rows)]


ALG_NAMES = {"confidence": "maskgit_plus", "margin": "topk_margin", "entropy": "entropy", "origin": "origin"}


def decode_with_options(
    model: ReferenceModel, prompt: Sequence[int], options, vocab_limit: int | None = None, commit_rows: bool = False
):
    """One request under ``blockbatch.DecodeOptions`` (unset options: Dream's defaults from the
    options table), through the decoder of its policy: what the native engine must return."""
    o = options

    def opt(name):
        return o.resolved(name, "dream")

    if o.policy == "vanilla":
        return dream_vanilla(
            model,
            prompt,
            o.gen_length,
            o.steps if o.steps is not None else o.gen_length,
            alg=ALG_NAMES[opt("alg")],
            alg_temp=o.alg_temp,
            eps=o.eps,
            temperature=o.temperature,
            top_p=o.top_p,
            top_k=o.top_k,
            seed=o.seed,
            vocab_limit=vocab_limit,
            stop_on_eos=opt("stop_on_eos"),
        )
    if o.policy in ("prefix", "dual"):
        return dream_cached(
            model,
            prompt,
            o.gen_length,
            o.block_length,
            o.threshold,
            dual=o.policy == "dual",
            top_p=o.top_p,
            top_k=o.top_k,
            vocab_limit=vocab_limit,
            stop_on_eos=opt("stop_on_eos"),
        )
    return dream_blockbatch(
        model,
        prompt,
        o.gen_length,
        opt("block_sizes"),
        threshold=o.threshold,
        merge_gate=o.merge_gate,
        sync_gap=o.sync_gap,
        refresh_tokens=o.refresh_tokens,
        prob_floor=opt("prob_floor"),
        stop_on_eos=opt("stop_on_eos"),
        merge=o.merge,
        sync=o.sync,
        vocab_limit=vocab_limit,
        sync_refresh=o.sync_refresh,
        fold_rows=o.fold_rows,
        share_prompt_kv=o.share_prompt_kv,
        commit_rows=commit_rows,
    )
