"""BlockBatch multi-branch consensus decoding in plain Python (ALGORITHMS.md 4; Dream's rules 5.4).

One request is decoded by several block-size branches at once. Each branch owns a canvas row
and a KV row. A full forward of row 0 (its K/V copied to every row) starts every branch; then every
iteration: one batched block forward over the windows of all branches that still have masks
(dual-cache semantics), the exit check, window advance, confidence-gated merging, leader sync, and
(when the refresh clock says so) one batched full forward over the active rows. One policy for
every family: where two families differ, their row of ``policies.RULES`` says how.

This is the oracle for ``torch.ops.blockbatch.decode(policy="blockbatch")``: tokens, winner and
every NFE counter must match.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .. import contract
from .model import ReferenceModel
from .policies import RULES, propose, select_threshold, shift_rows
from .proposals import topk_propose

DIVERGENCE_EPS = 1e-9  # squared distances below this are rounding noise, not drift
# EOS-ready branches whose EOS probabilities differ by less than float32's machine epsilon are
# tied at the early exit, and the smallest block size among them wins (docs/ALGORITHMS.md, "early
# exit"). The authors rank them by a low-precision softmax (bfloat16; float32 in our parity runs),
# in which near-certain probabilities collapse onto equal values and max() keeps the first branch.
EOS_TIE = 2.0**-23


@dataclasses.dataclass
class Branch:
    block_size: int
    row: int  # canvas row / KV row index (position in sorted block sizes)
    start: int = 0  # current window [start, end)
    end: int = 0
    decoded: int = 0  # tokens committed by its forwards or received by sync (or counted on the row)
    progress: int = 0  # first masked generated position (relative), G / first EOS + 1 when done
    done: bool = False
    since_refresh: int = 0  # the refresh clock: blocks or frontier tokens since the last full forward
    eos_ready: bool = False
    eos_prob: float = 0.0
    prob_map: dict[int, dict[int, float]] = dataclasses.field(default_factory=dict)
    committed: int = 0
    merged: int = 0
    copied: int = 0
    nfe_init: int = 0
    nfe_block: int = 0
    nfe_refresh: int = 0
    # commit_rows (the `logprobs` rule, ALGORITHMS.md 17): per position, the logits row its token came
    # from (rows), and per map entry the row that gave each token its probability (seen)
    rows: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    seen: dict[int, dict[int, torch.Tensor]] = dataclasses.field(default_factory=dict)

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
    exit_reason: str = ""  # "eos_ready" | "branch_complete" | "all_branches_done"
    folded_rows: int = 0  # fold_rows: refresh rows a folding engine does not feed (an earlier row has their canvas)
    folded_tokens: int = 0
    # commit_rows: per generated position of the winner, the logits row its token came from (None: none)
    commit_rows: list[torch.Tensor | None] | None = None


class _BlockBatch:
    def __init__(self, model: ReferenceModel, prompt: torch.Tensor, gen_length: int, block_sizes, family: str, o: dict):
        self.t_start = time.perf_counter()
        self.rules, self.o, self.model = RULES[family], o, model
        cfg = model.config
        self.mask = cfg.mask_token_id
        self.eos = cfg.eos_token_id if o["stop_on_eos"] else -1
        self.lp, self.G = prompt.numel(), gen_length
        self.L = self.lp + gen_length
        if self.rules.logit_shift and self.lp == 0:
            raise ValueError(f"{family} decoding needs a non-empty prompt")
        sizes = sorted(block_sizes)
        for b in sizes:
            if gen_length % b:
                raise ValueError(f"gen_length {gen_length} is not a multiple of block size {b}")
        self.generator = torch.Generator().manual_seed(o["seed"]) if o["temperature"] > 0 else None
        self.canvas = torch.full((len(sizes), self.L), self.mask, dtype=torch.long)
        self.canvas[:, : self.lp] = prompt
        self.kv = model.new_kv(len(sizes), self.L)
        self.branches = [Branch(block_size=b, row=i, start=self.lp, end=self.lp + b) for i, b in enumerate(sizes)]
        self.log_committed: list[int] = []
        self.log_queries: list[int] = []
        self.counters = {"init": 0, "block": 0, "refresh": 0}
        self.synced = False  # sync_refresh: this coordination's sync copied a branch that is not done
        self.folded_rows = 0

    # -- a row's state ---------------------------------------------------------------------------
    def has_masks(self, br: Branch, a: int, b: int) -> bool:
        return bool((self.canvas[br.row, a:b] == self.mask).any())

    def first_eos(self, row: int) -> int | None:
        """Offset of the row's first EOS where the rules cut a generation there (else None)."""
        if self.eos < 0 or not self.rules.eos_cut:
            return None
        hits = (self.canvas[row, self.lp :] == self.eos).nonzero()
        return int(hits[0, 0]) if len(hits) else None

    def snap(self, br: Branch) -> None:
        """Window = the own-size block of the first mask (before the first EOS, its end clipped there)."""
        gen = self.canvas[br.row, self.lp :]
        fe = self.first_eos(br.row)
        decode_end = self.G if fe is None else fe
        if self.rules.count_from_row:
            br.decoded = int((gen[: self.G if fe is None else fe + 1] != self.mask).sum())
        masks = (gen[:decode_end] == self.mask).nonzero()
        if len(masks) == 0:
            br.done = True
            br.progress = self.G if fe is None else fe + 1
            br.start = br.end = self.lp + br.progress
            return
        first = int(masks[0, 0])
        br.done, br.progress = False, first
        br.start = self.lp + first // br.block_size * br.block_size
        br.end = min(br.start + br.block_size, self.lp + decode_end)

    def advance(self, br: Branch) -> None:
        old = br.progress
        self.snap(br)
        if self.rules.refresh_clock == "tokens":
            br.since_refresh += max(br.progress - old, 0)
        elif not br.done:
            br.since_refresh += 1

    def window_hi(self, br: Branch) -> int:
        fe = self.first_eos(br.row)
        return br.end if fe is None else min(br.end, self.lp + fe)

    # -- forwards ----------------------------------------------------------------------------------
    def record(self, br: Branch, logits: torch.Tensor, first_pos: int) -> None:
        """Sparse map: for each covered position, the tokens with probability > prob_floor."""
        probs = torch.softmax(logits.double() if self.rules.readout == "argmax" else logits.float(), dim=-1)
        for i in range(logits.shape[0]):
            keep = (probs[i] > self.o["prob_floor"]).nonzero()[:, 0]
            entry = {int(t): float(probs[i, t]) for t in keep}
            rows = {t: logits[i] for t in entry} if self.o["commit_rows"] else {}
            if self.rules.map_accumulate:
                br.prob_map.setdefault(first_pos + i, {}).update(entry)
                br.seen.setdefault(first_pos + i, {}).update(rows)
            else:
                br.prob_map[first_pos + i] = entry
                br.seen[first_pos + i] = rows

    def commit(self, br: Branch, logits: torch.Tensor, lo: int, hi: int) -> int:
        """Threshold rule over [lo, hi); logits rows = those positions."""
        window = self.canvas[br.row, lo:hi]
        target = window == self.mask
        if self.rules.readout == "argmax":
            x0, conf = propose(logits, self.mask, self.o["temperature"], self.generator)
            conf = torch.where(target, conf, torch.full_like(conf, float("-inf")))
            if not torch.isfinite(conf).any():
                return 0
            chosen = select_threshold(conf, self.o["threshold"])
        else:  # topk: the most confident masked position whose proposal is not EOS stands in if none passes
            if hi <= lo or not target.any():
                return 0
            x0, conf = topk_propose(logits, self.mask, self.o["vocab_limit"])
            masked_conf = conf.masked_fill(~target, float("-inf"))
            no_eos = masked_conf.clone()
            no_eos[x0 == self.eos] = float("-inf")
            chosen = target & (conf >= self.o["threshold"])
            if not chosen.any():
                pick = no_eos if float(no_eos.max()) > float("-inf") else masked_conf
                chosen[int(pick.argmax())] = True
        window[chosen] = x0[chosen]
        if self.o["commit_rows"]:
            for i in chosen.nonzero()[:, 0].tolist():
                br.rows[lo + i] = logits[i]
        k = int(chosen.sum())
        if not self.rules.count_from_row:
            br.decoded += k
        br.committed += k
        return k

    def seed(self, br: Branch, logits: torch.Tensor) -> int:
        """Dream's full-forward rule: the window's first mask from the (shifted) full-forward logits."""
        window = self.canvas[br.row, br.start : self.window_hi(br)] == self.mask
        if br.done or not window.any():
            return 0
        pos = br.start + int(window.nonzero()[0, 0])
        self.canvas[br.row, pos] = topk_propose(logits[pos : pos + 1], self.mask, self.o["vocab_limit"])[0][0]
        br.rows[pos] = logits[pos]
        br.committed += 1
        br.prob_map, br.seen = {}, {}
        self.advance(br)
        return 1

    def full_forward(self, rows: list[Branch], init: bool) -> None:
        """Init (batch-1 forward, KV copied to every row) or refresh (one forward, all given rows)."""
        L = self.L
        if init:
            out = self.model.forward([self.canvas[0]], [torch.arange(L)], self.kv, "full", kv_rows=[0])
            self.kv[1:] = self.kv[0]
            per_row = out * len(rows)
            self.counters["init"] += 1
            self.log_queries.append(L)
        else:
            per_row = self.model.forward(
                [self.canvas[br.row] for br in rows],
                [torch.arange(L)] * len(rows),
                self.kv,
                "full",
                kv_rows=[br.row for br in rows],
            )
            self.counters["refresh"] += 1
            # Every row is computed here; with fold_rows the log counts what the engine feeds: a row
            # whose canvas equals an earlier row's once (its outputs and K/V are that row's).
            fed = len({tuple(self.canvas[br.row].tolist()) for br in rows}) if self.o["fold_rows"] else len(rows)
            self.folded_rows += len(rows) - fed
            self.log_queries.append(L * fed)
        if self.o["share_prompt_kv"]:  # every row reads the prompt K/V of the first row fed (ALGORITHMS.md 12)
            owner = 0 if init else rows[0].row
            self.kv[:, :, :, :, : self.lp] = self.kv[owner, :, :, :, : self.lp].clone()
        total = 0
        for br, logits in zip(rows, per_row):
            if init:
                br.nfe_init += 1
            else:
                br.nfe_refresh += 1
            if self.rules.logit_shift:
                logits = shift_rows(logits)
            if self.rules.seed:
                total += self.seed(br, logits)
            else:
                self.record(br, logits[self.lp :], self.lp)
                total += self.commit(br, logits[br.start : br.end], br.start, br.end)
            br.since_refresh = 0
        self.log_committed.append(total)

    def block_step(self) -> None:
        """Batched block denoise over every active branch whose window has masks; with a logit shift
        each window feeds its predecessor window, so output j maps onto window position j."""
        rows = [br for br in self.branches if not br.done and self.has_masks(br, br.start, br.end)]
        if not rows:
            return
        sh = self.rules.logit_shift
        per_row = self.model.forward(
            [self.canvas[br.row, br.start - sh : br.end - sh].clone() for br in rows],
            [torch.arange(br.start - sh, br.end - sh) for br in rows],
            self.kv,
            "dual",
            kv_rows=[br.row for br in rows],
        )
        self.counters["block"] += 1
        self.log_queries.append(sum(br.end - br.start for br in rows))
        total = 0
        for br, logits in zip(rows, per_row):
            br.nfe_block += 1
            lo, hi = br.start, min(self.window_hi(br), self.L)
            logits, live = logits[: max(hi - lo, 0)], hi > lo and self.has_masks(br, lo, hi)
            total += self.commit(br, logits, lo, hi)
            if live:
                self.record(br, logits, lo)
            window = self.canvas[br.row, br.start : br.end]
            if self.rules.exit == "eos_probability":
                if self.eos >= 0 and not bool((window == self.mask).any()) and bool((window == self.eos).any()):
                    first = int((window == self.eos).nonzero()[0])
                    br.eos_ready = True
                    br.eos_prob = float(torch.softmax(logits[first].double(), -1)[self.eos])
            else:
                self.advance(br)
        self.log_committed.append(total)

    # -- coordination --------------------------------------------------------------------------------
    def leader(self) -> Branch:
        """Most decoded tokens, done branches included; the smallest block size wins ties."""
        return max(self.branches, key=lambda br: br.decoded)  # max keeps the first of equals

    def counted_end(self, row: int) -> int:
        fe = self.first_eos(row)
        return self.G if fe is None else fe + 1

    def compatible(self, dst: Branch, src: Branch) -> bool:
        n = min(self.counted_end(dst.row), self.counted_end(src.row))
        a, b = self.canvas[dst.row, self.lp : self.lp + n], self.canvas[src.row, self.lp : self.lp + n]
        both = (a != self.mask) & (b != self.mask)
        return bool((a[both] == b[both]).all())

    def merge_positions(self, dst: Branch, sources: list[Branch]):
        """LLaDA: the sources' windows, each position once; eos_cut (Dream): the destination's own window."""
        if not self.rules.eos_cut:
            return list(dict.fromkeys(p for s in sources for p in range(s.start, s.end)))
        fe = self.first_eos(dst.row)
        hi = min(dst.end, self.L) if fe is None else min(dst.end, self.L, self.lp + fe)
        return range(max(dst.start, self.lp), hi)

    def merge_step(self) -> None:
        gate, mask = self.o["merge_gate"], self.mask
        order = sorted([br for br in self.branches if not br.done], key=lambda br: br.end, reverse=True)  # stable
        for i, dst in enumerate(order):
            sources = [s for s in order[i + 1 :] if self.compatible(dst, s)]
            filled = 0
            for pos in self.merge_positions(dst, sources):
                if self.canvas[dst.row, pos] != mask or not dst.prob_map.get(pos):
                    continue
                best_tok, best_p = mask, 0.0
                for s in sources:
                    sfe = self.first_eos(s.row)
                    tok = int(self.canvas[s.row, pos])
                    if tok == mask or (sfe is not None and pos > self.lp + sfe):
                        continue
                    p = dst.prob_map[pos].get(tok, 0.0)
                    if p > best_p:
                        best_tok, best_p = tok, p
                if (best_p >= gate if self.rules.gate_inclusive else best_p > gate) and best_tok != mask:
                    self.canvas[dst.row, pos] = best_tok
                    if self.o["commit_rows"]:  # the row whose probability the merge read
                        dst.rows[pos] = dst.seen[pos][int(best_tok)]
                    filled += 1
            dst.merged += filled
            if filled and not dst.done and (self.rules.count_from_row or not self.has_masks(dst, dst.start, dst.end)):
                self.advance(dst)

    def sync_step(self) -> None:
        lead = self.leader()
        for br in self.branches:
            if br is lead or br.done or lead.decoded - br.decoded <= self.o["sync_gap"]:
                continue
            before = self.canvas[br.row].clone()
            self.canvas[br.row] = self.canvas[lead.row]
            self.kv[br.row] = self.kv[lead.row]
            br.rows = dict(lead.rows)  # the records travel with the canvas
            if self.rules.count_from_row:
                br.copied += int(((before != self.canvas[br.row]) & (self.canvas[br.row] != self.mask)).sum())
            else:
                br.copied += max(lead.decoded - br.decoded, 0)
                br.decoded = lead.decoded
            if self.rules.map_accumulate:  # the map and the token clock describe the row: they travel with it
                br.prob_map = {p: dict(e) for p, e in lead.prob_map.items()}
                br.seen = {p: dict(e) for p, e in lead.seen.items()}
            if self.rules.refresh_clock == "tokens":
                br.since_refresh = lead.since_refresh
            self.snap(br)  # own block size
            if self.o["sync_refresh"] and not br.done:  # variant (ALGORITHMS.md 10.3): its copied KV row is stale
                self.synced = True

    def diverged(self) -> bool:
        """KV drift of the active rows (ALGORITHMS.md 4, divergence-triggered refresh)."""
        rows = [br.row for br in self.branches if not br.done]
        if len(rows) < 2:
            return False
        x = self.kv[rows].reshape(len(rows), self.model.config.n_layers * 2, -1).double()
        x = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        mu = x.mean(0)
        dist = ((x - mu) ** 2).sum(-1).mean(-1)  # per branch, averaged over tensors
        rho2 = (1 - (mu**2).sum(-1)).mean()
        # Identical rows (right after a sync) give dist = 0 and rho2 = +-1e-16 of rounding:
        # never refresh on rounding noise.
        return bool((dist > 2 * rho2.clamp_min(0)).any() and dist.max() > DIVERGENCE_EPS)

    def refresh_step(self) -> None:
        active = [br for br in self.branches if not br.done]
        if not active:
            return
        rt = self.o["refresh_tokens"]
        if self.o["refresh_mode"] == "divergence":
            wanted = rt > 0 and self.diverged()
        else:
            scale = (lambda br: br.block_size) if self.rules.refresh_clock == "blocks" else (lambda br: 1)
            wanted = rt > 0 and any(br.since_refresh * scale(br) >= rt for br in active)
        wanted, self.synced = wanted or self.synced, False
        if wanted:
            self.full_forward(active, init=False)

    def coordinate(self) -> BlockBatchResult | None:
        """Advance, merge, sync, refresh (the exit rule may end the decode between them)."""
        for br in self.branches:
            if self.rules.count_from_row:
                self.snap(br)
            elif not br.done and not self.has_masks(br, br.start, br.end):
                self.advance(br)
        if self.leader().decoded > 0:
            if self.o["merge"]:
                self.merge_step()
            if self.rules.count_from_row:
                for br in self.branches:
                    self.snap(br)
            if self.o["sync"]:
                self.sync_step()
        result = self.exit_check("coordinate")
        if result is None:
            self.refresh_step()
            result = self.exit_check("refresh")
        return result

    # -- exits ---------------------------------------------------------------------------------------
    def exit_check(self, phase: str) -> BlockBatchResult | None:
        if self.rules.exit == "eos_probability":
            ready = [br for br in self.branches if br.eos_ready] if phase == "block" else []
            if not ready:
                return None
            best = max(br.eos_prob for br in ready)  # the first (smallest block) within EOS_TIE of the best
            return self.finish(next(br for br in ready if br.eos_prob >= best - EOS_TIE), "eos_ready")
        for br in self.branches:
            self.snap(br)
        ready = []
        for br in self.branches:
            fe = self.first_eos(br.row)
            if fe is not None and not self.has_masks(br, self.lp, self.lp + fe):
                br.done = True
                ready.append(br)
        if ready:
            return self.finish(max(ready, key=lambda br: (br.decoded, br.progress, br.block_size)), "eos_ready")
        complete = [br for br in self.branches if not self.has_masks(br, self.lp, self.L)]
        for br in complete:
            br.done, br.progress, br.decoded = True, self.G, self.G
        if complete:
            return self.finish(max(complete, key=lambda br: (br.decoded, br.block_size)), "branch_complete")
        return None

    def finish(self, winner: Branch, reason: str) -> BlockBatchResult:
        c = self.counters
        nfe = c["init"] + c["block"] + c["refresh"]
        return BlockBatchResult(
            tokens=self.canvas[winner.row].clone(),
            nfe=nfe,
            nfe_init=c["init"],
            nfe_block=c["block"],
            nfe_refresh=c["refresh"],
            nfe_paper=winner.forwards if self.rules.nfe_winner else nfe,
            winner=winner.row,
            winner_block_size=winner.block_size,
            early_exit=reason == "eos_ready",
            branches=self.branches,
            committed_per_step=self.log_committed,
            query_tokens_per_step=self.log_queries,
            wall_s=time.perf_counter() - self.t_start,
            exit_reason=reason,
            folded_rows=self.folded_rows,
            folded_tokens=self.folded_rows * self.L,
            commit_rows=[winner.rows.get(p) for p in range(self.lp, self.L)] if self.o["commit_rows"] else None,
        )

    def run(self) -> BlockBatchResult:
        self.full_forward(self.branches, init=True)
        result = self.exit_check("init") or self.coordinate()
        while result is None and not all(br.done for br in self.branches):
            self.block_step()
            result = self.exit_check("block") or self.coordinate()
        if result is None:  # every branch done without an exit
            if self.rules.exit == "eos_probability":
                progress = lambda br: (self.L if br.done else br.start) - self.lp  # noqa: E731
            else:
                progress = lambda br: (br.progress, br.block_size)  # noqa: E731
            result = self.finish(max(self.branches, key=progress), "all_branches_done")
        return result


_D = contract.defaults_for("blockbatch")  # the table's defaults


def blockbatch_generate(
    model: ReferenceModel,
    prompt: torch.Tensor,
    gen_length: int,
    block_sizes=_D["block_sizes"],
    threshold: float = _D["threshold"],
    merge_gate: float = _D["merge_gate"],
    sync_gap: int = _D["sync_gap"],
    refresh_tokens: int = _D["refresh_tokens"],
    refresh_mode: str = _D["refresh_mode"],
    prob_floor: float = _D["prob_floor"],
    stop_on_eos: bool = _D["stop_on_eos"],
    merge: bool = _D["merge"],
    sync: bool = _D["sync"],
    temperature: float = _D["temperature"],
    seed: int = _D["seed"],
    sync_refresh: bool = _D["sync_refresh"],
    fold_rows: bool = _D["fold_rows"],
    share_prompt_kv: bool = _D["share_prompt_kv"],
    family: str = "llada",
    vocab_limit: int | None = None,
    commit_rows: bool = False,
) -> BlockBatchResult:
    """BlockBatch over one prompt (``[Lp]`` int64) under the rules of ``family``; ``vocab_limit``
    (the topk readout): only ids below it are proposed. ``commit_rows``: the result's
    ``commit_rows`` hold the logits row each of the winner's tokens came from (the `logprobs` rule,
    docs/ALGORITHMS.md 17: a commit's row; a merge's, the row whose probability it read; a sync
    copies the leader's)."""
    o = dict(
        threshold=threshold,
        merge_gate=merge_gate,
        sync_gap=sync_gap,
        refresh_tokens=refresh_tokens,
        refresh_mode=refresh_mode,
        prob_floor=prob_floor,
        stop_on_eos=stop_on_eos,
        merge=merge,
        sync=sync,
        temperature=temperature,
        seed=seed,
        sync_refresh=sync_refresh,
        fold_rows=fold_rows,
        share_prompt_kv=share_prompt_kv,
        vocab_limit=vocab_limit,
        commit_rows=commit_rows,
    )
    return _BlockBatch(model, prompt, gen_length, block_sizes, family, o).run()
