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

The two single-branch ones are ``policies.generate`` under Dream's rules (``policies.RULES``);
the proposal (Dream's ``sample_tokens``) is in ``proposals.py``.

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
import math
from typing import Sequence

import torch

from .model import ReferenceModel
from .policies import generate, shift_rows

PROB_FLOOR = 0.2       # BlockBatch-Dream probability map floor (strictly above)
MERGE_GATE = 0.5       # a merged token needs map probability >= gate (Dream uses >=, LLaDA >)
SYNC_GAP = 8
REFRESH_TOKENS = 32
MASK_PENALTY = -1e4    # BlockBatch-Dream writes this into the mask id's logit before ranking


@dataclasses.dataclass
class DreamResult:
    tokens: list[int]          # the canvas row returned (prompt + generation; cut after EOS on early exit)
    nfe: int                   # forwards executed
    stats: dict = dataclasses.field(default_factory=dict)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.stats.get("prompt_len", 0):]


def _canvas(prompt: Sequence[int], gen_length: int, mask_id: int) -> torch.Tensor:
    prompt = torch.as_tensor(list(prompt), dtype=torch.long)
    if prompt.numel() == 0:
        raise ValueError("Dream decoding needs a non-empty prompt")
    return torch.cat([prompt, torch.full((gen_length,), mask_id, dtype=torch.long)])


def _full_logits(model: ReferenceModel, x: torch.Tensor, kv: torch.Tensor | None = None, row: int = 0):
    """Shifted logits ``[L, V]`` of one full forward over the canvas ``x`` (writes KV row ``row``)."""
    L = x.numel()
    out = model.forward([x], [torch.arange(L)], kv, "full", kv_rows=[row])[0]
    return shift_rows(out)


# ------------------------------------------------------------------ single-branch policies


def _single(model: ReferenceModel, prompt: Sequence[int], gen_length: int, **kw) -> DreamResult:
    if len(prompt) == 0:
        raise ValueError("Dream decoding needs a non-empty prompt")
    r = generate(model, torch.as_tensor(list(prompt), dtype=torch.long), gen_length, family="dream", **kw)
    return DreamResult(r.tokens.tolist(), r.nfe, {"prompt_len": len(prompt), "nfe_full": r.nfe_full,
                                                  "nfe_block": r.nfe_block})


def dream_vanilla(model: ReferenceModel, prompt: Sequence[int], gen_length: int, steps: int,
                  alg: str = "entropy", alg_temp: float = 0.0, eps: float = 1e-3, temperature: float = 0.0,
                  top_p: float | None = None, top_k: int | None = None, seed: int = 0,
                  vocab_limit: int | None = None, stop_on_eos: bool = False) -> DreamResult:
    """Dream's sampler: ``steps`` full forwards over the whole canvas (no blocks); the rules are
    ``policies.generate``'s timestep schedule. Random draws come from a generator seeded with
    ``seed`` (the authors draw from torch's global one: seeding it with the same seed gives the
    same stream for ``origin``). NFE = steps."""
    return _single(model, prompt, gen_length, block_length=gen_length, policy="vanilla", steps=steps, alg=alg,
                   alg_temp=alg_temp, eps=eps, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                   vocab_limit=vocab_limit, threshold=None, stop_on_eos=stop_on_eos)


def dream_cached(model: ReferenceModel, prompt: Sequence[int], gen_length: int, block_length: int = 32,
                 threshold: float = 0.9, dual: bool = True, top_p: float | None = None,
                 top_k: int | None = None, vocab_limit: int | None = None, stop_on_eos: bool = False) -> DreamResult:
    """Fast-dLLM prefix (``dual=False``) or dual cache for Dream, threshold rule (``policies.generate``
    with Dream's rules: the block start's full forward writes the block's first position, then at
    least one window step; the window's outputs are shifted by one inside the window).
    NFE = blocks + block steps. ``stop_on_eos`` (not in the authors' decoder): a block that holds
    EOS ends the decode, the rest of the canvas EOS."""
    return _single(model, prompt, gen_length, block_length=block_length, policy="dual" if dual else "prefix",
                   threshold=threshold, top_p=top_p, top_k=top_k, vocab_limit=vocab_limit, stop_on_eos=stop_on_eos)


# ---------------------------------------------------------------------------------- BlockBatch


@dataclasses.dataclass
class _Branch:
    row: int
    block: int
    start: int = 0
    end: int = 0
    progress: int = 0          # first masked generated position (relative), or G / first EOS + 1 when done
    decoded: int = 0           # non-mask generated tokens up to the first EOS (recounted from the row)
    since_refresh: int = 0     # frontier progress (tokens) since the last full forward
    done: bool = False
    probs: list | None = None  # per canvas position: {token: probability} accumulated since the last full forward
    committed: int = 0
    merged: int = 0
    copied: int = 0


class _DreamBlockBatch:
    def __init__(self, model, prompt, gen_length, block_sizes, threshold, merge_gate, sync_gap, refresh_tokens,
                 prob_floor, stop_on_eos, merge=True, sync=True, vocab_limit=None, sync_refresh=False):
        self.merge_on, self.sync_on, self.vocab_limit = merge, sync, vocab_limit
        self.sync_refresh, self.synced = sync_refresh, False  # variant: refresh after a sync (ALGORITHMS.md 10.3)
        c = model.config
        self.model, self.mask, self.G = model, c.mask_token_id, gen_length
        self.eos = c.eos_token_id if stop_on_eos else -1
        self.Lp = len(prompt)
        self.L = self.Lp + gen_length
        self.threshold, self.gate, self.gap, self.refresh_tokens, self.floor = (
            threshold, merge_gate, sync_gap, refresh_tokens, prob_floor)
        sizes = sorted(block_sizes)
        for b in sizes:
            if gen_length % b:
                raise ValueError(f"gen_length {gen_length} is not a multiple of block size {b}")
        self.x = _canvas(prompt, gen_length, self.mask)[None].repeat(len(sizes), 1)
        self.kv = model.new_kv(len(sizes), self.L)
        self.branches = [_Branch(k, b, self.Lp, min(self.Lp + b, self.L)) for k, b in enumerate(sizes)]
        self.nfe = {"init": 0, "block": 0, "refresh": 0}

    # -- row bookkeeping --------------------------------------------------------------------
    def _first_eos(self, row: int) -> int | None:
        if self.eos < 0:
            return None
        hits = (self.x[row, self.Lp:] == self.eos).nonzero()
        return int(hits[0, 0]) if len(hits) else None

    def _snap(self, b: _Branch) -> None:
        """Window = own-size block of the first mask before the first EOS; recount ``decoded``."""
        gen = self.x[b.row, self.Lp:]
        fe = self._first_eos(b.row)
        counted_end = self.G if fe is None else fe + 1
        decode_end = self.G if fe is None else fe
        b.decoded = int((gen[:counted_end] != self.mask).sum())
        masks = (gen[:decode_end] == self.mask).nonzero()
        if len(masks) == 0:
            b.done = True
            b.progress = self.G if fe is None else fe + 1
            b.start = b.end = self.Lp + b.progress
            return
        first = int(masks[0, 0])
        b.done = False
        b.start = self.Lp + first // b.block * b.block
        b.end = min(b.start + b.block, self.Lp + decode_end)
        b.progress = first

    def _advance(self, b: _Branch) -> None:
        old = b.progress
        self._snap(b)
        b.since_refresh += max(b.progress - old, 0)

    def _to_active_window(self, b: _Branch) -> None:
        while not b.done and not (self.x[b.row, b.start:b.end] == self.mask).any():
            prev = b.progress
            self._advance(b)
            if b.done or b.progress <= prev:
                break

    def _window_hi(self, b: _Branch) -> int:
        fe = self._first_eos(b.row)
        return b.end if fe is None else min(b.end, self.Lp + fe)

    # -- forwards ------------------------------------------------------------------------------
    def _seed(self, branches: list[_Branch], logits: list[torch.Tensor]) -> None:
        """After a full forward: each branch writes its window's first mask from the shifted logits."""
        for b, lg in zip(branches, logits):
            if b.done:
                continue
            self._to_active_window(b)
            hi = self._window_hi(b)
            window = self.x[b.row, b.start:hi] == self.mask
            if b.done or not window.any():
                b.since_refresh = 0
                continue
            pos = b.start + int(window.nonzero()[0, 0])
            row = lg[pos:pos + 1].clone()
            row[:, self.mask] = MASK_PENALTY
            _, pred = torch.topk(self._proposable(row.float()), k=1, dim=-1)
            self.x[b.row, pos] = pred[0, 0]
            b.committed += 1
            b.probs = None
            self._advance(b)
            b.since_refresh = 0

    def _init(self) -> None:
        logits = _full_logits(self.model, self.x[0], self.kv, row=0)
        self.kv[1:] = self.kv[0]
        self.nfe["init"] += 1
        self._seed(self.branches, [logits] * len(self.branches))

    def _refresh(self) -> None:
        active = [b for b in self.branches if not b.done]
        if not active:
            return
        logits = [_full_logits(self.model, self.x[b.row], self.kv, row=b.row) for b in active]
        self.nfe["refresh"] += 1
        self._seed(active, logits)

    def _block_step(self) -> bool:
        todo = []
        for b in self.branches:
            if b.done:
                continue
            self._to_active_window(b)
            if not b.done and (self.x[b.row, b.start:b.end] == self.mask).any():
                todo.append(b)
        if not todo:
            return False
        ids = [self.x[b.row, b.start - 1:b.end - 1] for b in todo]
        pos = [torch.arange(b.start - 1, b.end - 1) for b in todo]
        outs = self.model.forward(ids, pos, self.kv, "dual", kv_rows=[b.row for b in todo])
        self.nfe["block"] += 1
        for b, out in zip(todo, outs):
            self._absorb(b, out)
        return True

    def _absorb(self, b: _Branch, out: torch.Tensor) -> None:
        """Output ``j`` of the predecessor window predicts canvas ``start + j``: commit, map, advance."""
        lo, hi = b.start, min(self._window_hi(b), self.L)
        n = hi - lo
        target = self.x[b.row, lo:hi] == self.mask if n > 0 else None
        if n <= 0 or not target.any():
            self._advance(b)
            return
        lg = out[:n].float().clone()
        lg[:, self.mask] = MASK_PENALTY
        _, pred = torch.topk(self._proposable(lg), k=1, dim=-1)
        conf = torch.gather(torch.softmax(lg, dim=-1), -1, pred).squeeze(-1)
        pred = pred.squeeze(-1)
        masked_conf = conf.masked_fill(~target, -math.inf)
        no_eos = masked_conf.clone()
        no_eos[pred == self.eos] = -math.inf
        take = target & (conf >= self.threshold)
        if not take.any():
            pick = no_eos if float(no_eos.max()) > -math.inf else masked_conf
            take[int(pick.argmax())] = True
        self.x[b.row, lo:hi][take] = pred[take]
        b.committed += int(take.sum())
        self._record(b, out[:n], lo)
        self._advance(b)

    def _proposable(self, lg: torch.Tensor) -> torch.Tensor:
        """Logits for ranking proposals: the ids at or above vocab_limit never win (see _propose)."""
        if self.vocab_limit is None or self.vocab_limit >= lg.shape[-1]:
            return lg
        lg = lg.clone()
        lg[:, self.vocab_limit:] = -math.inf
        return lg

    def _record(self, b: _Branch, logits: torch.Tensor, lo: int) -> None:
        if b.probs is None:
            b.probs = [{} for _ in range(self.L)]
        probs = torch.softmax(logits.float(), dim=-1)
        rows, toks = (probs > self.floor).nonzero(as_tuple=True)
        for r, t in zip(rows.tolist(), toks.tolist()):
            b.probs[lo + r][t] = probs[r, t].item()

    # -- coordination --------------------------------------------------------------------------
    def _snap_all(self) -> None:
        for b in self.branches:
            self._snap(b)

    def _leader(self) -> _Branch:
        return max(self.branches, key=lambda b: b.decoded)  # first of equal counts: smallest block

    def _compatible(self, dst: _Branch, sources: list[_Branch]) -> list[_Branch]:
        def counted_end(row):
            fe = self._first_eos(row)
            return self.G if fe is None else fe + 1

        gd = self.x[dst.row, self.Lp:]
        out = []
        for src in sources:
            gs = self.x[src.row, self.Lp:]
            n = min(counted_end(dst.row), counted_end(src.row))
            both = (gd[:n] != self.mask) & (gs[:n] != self.mask)
            if not both.any() or bool((gd[:n][both] == gs[:n][both]).all()):
                out.append(src)
        return out

    def _merge(self, dst: _Branch, sources: list[_Branch]) -> None:
        if dst.probs is None:
            return
        fe = self._first_eos(dst.row)
        lo, hi = max(dst.start, self.Lp), min(dst.end, self.L)
        if fe is not None:
            hi = min(hi, self.Lp + fe)
        filled = 0
        for pos in range(lo, hi):
            if int(self.x[dst.row, pos]) != self.mask or not dst.probs[pos]:
                continue
            best_tok, best_p = self.mask, 0.0
            for src in sources:
                if src.done:
                    continue
                sfe = self._first_eos(src.row)
                if sfe is not None and pos > self.Lp + sfe:
                    continue
                tok = int(self.x[src.row, pos])
                if tok == self.mask:
                    continue
                p = dst.probs[pos].get(tok, 0.0)
                if p > best_p:
                    best_tok, best_p = tok, p
            if best_p >= self.gate and best_tok != self.mask:
                self.x[dst.row, pos] = best_tok
                filled += 1
        if filled:
            dst.merged += filled
            self._advance(dst)

    def _sync(self, dst: _Branch, leader: _Branch) -> None:
        before = self.x[dst.row].clone()
        self.x[dst.row] = self.x[leader.row]
        dst.copied += int(((before != self.x[dst.row]) & (self.x[dst.row] != self.mask)).sum())
        dst.since_refresh = leader.since_refresh
        dst.probs = None if leader.probs is None else [dict(p) for p in leader.probs]
        self.kv[dst.row] = self.kv[leader.row]
        self._snap(dst)

    def _coordinate(self) -> None:
        self._snap_all()
        if self._leader().decoded == 0:
            return
        order = sorted([b for b in self.branches if not b.done], key=lambda b: b.end, reverse=True)
        if self.merge_on and not all(b.end <= self.Lp for b in order):
            for i, dst in enumerate(order):
                sources = self._compatible(dst, order[i + 1:])
                if sources:
                    self._merge(dst, sources)
        self._snap_all()
        leader = self._leader()
        for b in self.branches:
            if not self.sync_on or b is leader or b.done:
                continue
            if leader.decoded - b.decoded > self.gap:
                self._sync(b, leader)
                self.synced = self.synced or not b.done

    # -- exits ---------------------------------------------------------------------------------
    def _finished(self) -> DreamResult | None:
        self._snap_all()
        if self.eos >= 0:
            ready = []
            for b in self.branches:
                fe = self._first_eos(b.row)
                if fe is not None and not (self.x[b.row, self.Lp:self.Lp + fe] == self.mask).any():
                    b.done = True
                    ready.append(b)
            if ready:
                w = max(ready, key=lambda b: (b.decoded, b.progress, b.block))
                return self._result(w, "eos_ready", cut=self.Lp + self._first_eos(w.row) + 1)
        complete = []
        for b in self.branches:
            if not (self.x[b.row, self.Lp:] == self.mask).any():
                b.done, b.progress, b.decoded = True, self.G, self.G
                complete.append(b)
        if complete:
            w = max(complete, key=lambda b: (b.decoded, b.block))
            return self._result(w, "branch_complete")
        return None

    def _result(self, w: _Branch, reason: str, cut: int | None = None) -> DreamResult:
        tokens = self.x[w.row].tolist()
        if cut is not None:
            tokens = tokens[:cut]
        nfe = sum(self.nfe.values())
        return DreamResult(tokens, nfe, {
            "prompt_len": self.Lp, "nfe_init": self.nfe["init"], "nfe_block": self.nfe["block"],
            "nfe_refresh": self.nfe["refresh"], "winner_block_size": w.block, "exit_reason": reason,
            "early_exit": reason == "eos_ready",
            "branches": [{"block_size": b.block, "committed": b.committed, "merged": b.merged, "copied": b.copied}
                         for b in self.branches]})

    def run(self) -> DreamResult:
        self._init()
        result = self._finished()
        while result is None and not all(b.done for b in self.branches):
            result = self._finished()
            if result is not None:
                break
            if any(not b.done for b in self.branches):
                self._block_step()
            result = self._finished()
            if result is not None:
                break
            self._coordinate()
            result = self._finished()
            if result is not None:
                break
            active = [b for b in self.branches if not b.done]
            synced, self.synced = self.synced and self.sync_refresh, False
            if active and (synced or self.refresh_tokens > 0 and any(b.since_refresh >= self.refresh_tokens
                                                                     for b in active)):
                self._refresh()
                result = self._finished()
        if result is None:
            w = max(self.branches, key=lambda b: (b.progress, b.block))
            result = self._result(w, "all_branches_done")
        return result


def dream_blockbatch(model: ReferenceModel, prompt: Sequence[int], gen_length: int,
                     block_sizes: Sequence[int] = (4, 8, 16, 32, 64), threshold: float = 0.9,
                     merge_gate: float = MERGE_GATE, sync_gap: int = SYNC_GAP, refresh_tokens: int = REFRESH_TOKENS,
                     prob_floor: float = PROB_FLOOR, stop_on_eos: bool = False, merge: bool = True,
                     sync: bool = True, vocab_limit: int | None = None, sync_refresh: bool = False) -> DreamResult:
    """BlockBatch for Dream (ALGORITHMS.md section 5.4); NFE counts every forward executed.

    ``refresh_tokens=0`` never refreshes (the engine's meaning; the authors' default is 32);
    ``merge`` / ``sync`` are the ablation switches; ``sync_refresh`` the variant of section 10.3
    (a refresh after any coordination whose sync copied a branch that is not done)."""
    return _DreamBlockBatch(model, prompt, gen_length, block_sizes, threshold, merge_gate, sync_gap,
                            refresh_tokens, prob_floor, stop_on_eos, merge, sync, vocab_limit, sync_refresh).run()


ALG_NAMES = {"confidence": "maskgit_plus", "margin": "topk_margin", "entropy": "entropy", "origin": "origin"}


def decode_with_options(model: ReferenceModel, prompt: Sequence[int], options, vocab_limit: int | None = None):
    """One request under ``blockbatch.DecodeOptions`` (unset options: Dream's defaults from the
    options table), through the decoder of its policy: what the native engine must return."""
    o = options
    opt = (lambda name: o.resolved(name, "dream"))
    if o.policy == "vanilla":
        return dream_vanilla(model, prompt, o.gen_length, o.steps if o.steps is not None else o.gen_length,
                             alg=ALG_NAMES[opt("alg")], alg_temp=o.alg_temp, eps=o.eps, temperature=o.temperature,
                             top_p=o.top_p, top_k=o.top_k, seed=o.seed, vocab_limit=vocab_limit,
                             stop_on_eos=opt("stop_on_eos"))
    if o.policy in ("prefix", "dual"):
        return dream_cached(model, prompt, o.gen_length, o.block_length, o.threshold, dual=o.policy == "dual",
                            top_p=o.top_p, top_k=o.top_k, vocab_limit=vocab_limit, stop_on_eos=opt("stop_on_eos"))
    return dream_blockbatch(model, prompt, o.gen_length, opt("block_sizes"), threshold=o.threshold,
                            merge_gate=o.merge_gate, sync_gap=o.sync_gap, refresh_tokens=o.refresh_tokens,
                            prob_floor=opt("prob_floor"), stop_on_eos=opt("stop_on_eos"), merge=o.merge, sync=o.sync,
                            vocab_limit=vocab_limit, sync_refresh=o.sync_refresh)
