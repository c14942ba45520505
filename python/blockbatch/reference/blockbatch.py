"""BlockBatch multi-branch consensus decoding, written plainly from ALGORITHMS.md section 4.

One request is decoded by several block-size branches at once. Each branch owns a canvas row
and a KV row. Every iteration: one batched block forward over the windows of all branches that
still have masks (dual-cache semantics), EOS early exit, window advance, confidence-gated
merging, leader sync, and (periodically) one batched full-sequence refresh.

This is the oracle for ``torch.ops.blockbatch.decode(policy="blockbatch")``: tokens, winner and
every NFE counter must match.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .. import contract
from .model import ReferenceModel
from .policies import propose, select_threshold

DIVERGENCE_EPS = 1e-9  # squared distances below this are rounding noise, not drift
# EOS-ready branches whose EOS probabilities differ by less than float32's machine epsilon are
# tied at the early exit, and the smallest block size among them wins (docs/ALGORITHMS.md, "early
# exit"). The authors rank them by a low-precision softmax (bfloat16; float32 in our parity runs),
# in which near-certain probabilities collapse onto equal values and max() keeps the first branch.
EOS_TIE = 2.0 ** -23


@dataclasses.dataclass
class Branch:
    block_size: int
    row: int                       # canvas row / KV row index (position in sorted block sizes)
    start: int = 0                 # current window [start, end)
    end: int = 0
    decoded: int = 0               # tokens committed by its forwards or received by sync
    done: bool = False
    blocks_since_refresh: int = 0
    needs_refresh: bool = False
    eos_ready: bool = False
    eos_prob: float = 0.0
    prob_map: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
    committed: int = 0
    merged: int = 0
    copied: int = 0
    nfe_init: int = 0
    nfe_block: int = 0
    nfe_refresh: int = 0

    @property
    def forwards(self) -> int:
        return self.nfe_init + self.nfe_block + self.nfe_refresh


@dataclasses.dataclass
class BlockBatchResult:
    tokens: torch.Tensor
    nfe: int
    nfe_init: int
    nfe_block: int
    nfe_refresh: int
    nfe_paper: int
    winner: int
    winner_block_size: int
    early_exit: bool
    branches: list[Branch]
    committed_per_step: list[int]
    query_tokens_per_step: list[int]
    wall_s: float


_D = contract.defaults_for("blockbatch")  # the table's defaults


def blockbatch_generate(model: ReferenceModel, prompt: torch.Tensor, gen_length: int,
                        block_sizes=_D["block_sizes"], threshold: float = _D["threshold"],
                        merge_gate: float = _D["merge_gate"], sync_gap: int = _D["sync_gap"],
                        refresh_tokens: int = _D["refresh_tokens"], refresh_mode: str = _D["refresh_mode"],
                        prob_floor: float = _D["prob_floor"], stop_on_eos: bool = _D["stop_on_eos"],
                        merge: bool = _D["merge"], sync: bool = _D["sync"], temperature: float = _D["temperature"],
                        seed: int = _D["seed"], sync_refresh: bool = _D["sync_refresh"]) -> BlockBatchResult:
    t_start = time.perf_counter()
    cfg = model.config
    mask_id, eos_id = cfg.mask_token_id, cfg.eos_token_id
    sizes = sorted(block_sizes)
    n = len(sizes)
    lp = prompt.numel()
    L = lp + gen_length
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None

    canvas = torch.full((n, L), mask_id, dtype=torch.long)
    canvas[:, :lp] = prompt
    kv = model.new_kv(n, L)
    branches = [Branch(block_size=b, row=i, start=lp, end=lp + b) for i, b in enumerate(sizes)]
    log_committed: list[int] = []
    log_queries: list[int] = []
    counters = {"init": 0, "block": 0, "refresh": 0}
    synced = [False]  # sync_refresh: this coordination's sync copied a branch that is not done

    def has_masks(br: Branch, a: int, b: int) -> bool:
        return bool((canvas[br.row, a:b] == mask_id).any())

    def snap_window(br: Branch) -> None:
        """Window = the block of its own size holding its first masked generated position."""
        masked = (canvas[br.row, lp:] == mask_id).nonzero()
        if len(masked) == 0:
            br.done = True
            br.start = br.end = L
        else:
            k = int(masked[0]) // br.block_size
            br.start, br.end = lp + k * br.block_size, lp + (k + 1) * br.block_size

    def advance(br: Branch) -> None:
        snap_window(br)
        if not br.done:
            br.blocks_since_refresh += 1
            if refresh_tokens and refresh_mode == "periodic" and br.blocks_since_refresh * br.block_size >= refresh_tokens:
                br.needs_refresh = True

    def record_probs(br: Branch, logits: torch.Tensor, first_pos: int) -> None:
        """Sparse map: for each covered position, the tokens with probability > prob_floor."""
        probs = torch.softmax(logits.double(), dim=-1)
        for i in range(logits.shape[0]):
            keep = (probs[i] > prob_floor).nonzero()[:, 0]
            br.prob_map[first_pos + i] = {int(t): float(probs[i, t]) for t in keep}

    def commit_window(br: Branch, logits_window: torch.Tensor) -> int:
        """Threshold rule inside the branch's window; logits_window rows = window positions."""
        x0, conf = propose(logits_window, mask_id, temperature, generator)
        window = canvas[br.row, br.start:br.end]
        conf = torch.where(window == mask_id, conf, torch.full_like(conf, float("-inf")))
        if not torch.isfinite(conf).any():
            return 0
        chosen = select_threshold(conf, threshold)
        window[chosen] = x0[chosen]
        k = int(chosen.sum())
        br.decoded += k
        br.committed += k
        return k

    def full_forward(rows: list[Branch], init: bool) -> None:
        """Init (batch-1 forward, KV copied to every row) or refresh (one forward, all given rows)."""
        if init:
            logits = model.forward([canvas[0]], [torch.arange(L)], kv, "full", kv_rows=[0])
            kv[1:] = kv[0]
            per_row = [logits[0]] * len(rows)
            counters["init"] += 1
            log_queries.append(L)
        else:
            per_row = model.forward([canvas[br.row] for br in rows], [torch.arange(L)] * len(rows), kv, "full",
                                    kv_rows=[br.row for br in rows])
            counters["refresh"] += 1
            log_queries.append(L * len(rows))
        total = 0
        for br, logits in zip(rows, per_row):
            if init:
                br.nfe_init += 1
            else:
                br.nfe_refresh += 1
            br.blocks_since_refresh = 0
            br.needs_refresh = False
            record_probs(br, logits[lp:], lp)
            total += commit_window(br, logits[br.start:br.end])
        log_committed.append(total)

    def block_step() -> bool:
        """Batched block denoise over every active branch whose window has masks."""
        rows = [br for br in branches if not br.done and has_masks(br, br.start, br.end)]
        if not rows:
            return False
        per_row = model.forward([canvas[br.row, br.start:br.end].clone() for br in rows],
                                [torch.arange(br.start, br.end) for br in rows], kv, "dual",
                                kv_rows=[br.row for br in rows])
        counters["block"] += 1
        log_queries.append(sum(br.end - br.start for br in rows))
        total = 0
        for br, logits in zip(rows, per_row):
            br.nfe_block += 1
            record_probs(br, logits, br.start)
            total += commit_window(br, logits)
            window = canvas[br.row, br.start:br.end]
            if stop_on_eos and not bool((window == mask_id).any()) and bool((window == eos_id).any()):
                first = int((window == eos_id).nonzero()[0])
                br.eos_ready = True
                br.eos_prob = float(torch.softmax(logits[first].double(), -1)[eos_id])
        log_committed.append(total)
        return True

    def leader() -> Branch:
        """Most decoded tokens, done branches included; the smallest block size wins ties."""
        return max(branches, key=lambda br: br.decoded)  # max keeps the first of equals

    def compatible(dst: Branch, src: Branch) -> bool:
        a, b = canvas[dst.row, lp:], canvas[src.row, lp:]
        both = (a != mask_id) & (b != mask_id)
        return bool((a[both] == b[both]).all())

    def merge_step() -> None:
        order = sorted([br for br in branches if not br.done], key=lambda br: br.end, reverse=True)  # stable
        for i, dst in enumerate(order):
            sources = [s for s in order[i + 1:] if compatible(dst, s)]
            seen: set[int] = set()
            filled = 0
            for src in sources:
                for pos in range(src.start, src.end):
                    if pos in seen:
                        continue
                    seen.add(pos)
                    if canvas[dst.row, pos] != mask_id or not dst.prob_map.get(pos):
                        continue
                    best_tok, best_p = mask_id, 0.0
                    for s in sources:
                        tok = int(canvas[s.row, pos])
                        if tok == mask_id:
                            continue
                        p = dst.prob_map[pos].get(tok, 0.0)
                        if p > best_p:
                            best_tok, best_p = tok, p
                    if best_p > merge_gate and best_tok != mask_id:
                        canvas[dst.row, pos] = best_tok
                        filled += 1
            dst.merged += filled
            if filled and not dst.done and not has_masks(dst, dst.start, dst.end):
                advance(dst)

    def sync_step() -> None:
        lead = leader()
        for br in branches:
            if br is lead or br.done or lead.decoded - br.decoded <= sync_gap:
                continue
            canvas[br.row] = canvas[lead.row]
            kv[br.row] = kv[lead.row]
            br.copied += max(lead.decoded - br.decoded, 0)
            br.decoded = lead.decoded
            br.done = lead.done
            snap_window(br)  # own block size; its probability map and refresh counters stay
            if sync_refresh and not br.done:  # variant (ALGORITHMS.md 10.3): its copied KV row is stale
                synced[0] = True

    def diverged() -> bool:
        """KV drift of the active rows (ALGORITHMS.md 4, divergence-triggered refresh)."""
        rows = [br.row for br in branches if not br.done]
        if len(rows) < 2:
            return False
        x = kv[rows].reshape(len(rows), cfg.n_layers * 2, -1).double()
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        mu = x.mean(0)
        dist = ((x - mu) ** 2).sum(-1).mean(-1)           # per branch, averaged over tensors
        rho2 = (1 - (mu ** 2).sum(-1)).mean()
        # Identical rows (right after a sync) give dist = 0 and rho2 = +-1e-16 of rounding:
        # never refresh on rounding noise.
        return bool((dist > 2 * rho2.clamp_min(0)).any() and dist.max() > DIVERGENCE_EPS)

    def refresh_step() -> None:
        active = [br for br in branches if not br.done]
        if not active:
            return
        if refresh_mode == "divergence":
            wanted = refresh_tokens > 0 and diverged()
        else:
            wanted = any(br.needs_refresh for br in active)
        wanted, synced[0] = wanted or synced[0], False
        if wanted:
            full_forward(active, init=False)

    def coordinate() -> None:
        """Steps 3-6: advance, merge, sync, refresh."""
        for br in branches:
            if not br.done and not has_masks(br, br.start, br.end):
                advance(br)
        if leader().decoded > 0:
            if merge:
                merge_step()
            if sync:
                sync_step()
        refresh_step()

    def finish(winner: Branch, early: bool) -> BlockBatchResult:
        nfe = counters["init"] + counters["block"] + counters["refresh"]
        return BlockBatchResult(
            tokens=canvas[winner.row].clone(), nfe=nfe, nfe_init=counters["init"], nfe_block=counters["block"],
            nfe_refresh=counters["refresh"], nfe_paper=winner.forwards, winner=winner.row,
            winner_block_size=winner.block_size, early_exit=early, branches=branches,
            committed_per_step=log_committed, query_tokens_per_step=log_queries,
            wall_s=time.perf_counter() - t_start)

    full_forward(branches, init=True)
    coordinate()
    while not all(br.done for br in branches):
        block_step()
        ready = [br for br in branches if br.eos_ready]
        if ready:  # the first (smallest block size) within EOS_TIE of the highest EOS probability
            best = max(br.eos_prob for br in ready)
            return finish(next(br for br in ready if br.eos_prob >= best - EOS_TIE), early=True)
        coordinate()
    progress = lambda br: (L if br.done else br.start) - lp  # noqa: E731
    return finish(max(branches, key=progress), early=False)
