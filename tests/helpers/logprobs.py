"""Logprobs recomputed by the float32 reference (python/blockbatch/reference/): a recording wrapper
around a reference model keeps every forward's (positions, input ids, logits) rows, and
``expected`` reads, for each generated token, the row the decoder used when it committed it.

The rule that finds that row is policy-agnostic: a position's token was written (committed, or last
edited) by the last forward that read the position while it held something else (a mask or another
token); the row is the position's own output, or with shifted logits (Dream) the previous
position's, the row's first position reading its own (``reference.policies.shift_rows``)."""

from __future__ import annotations

import math

import torch


class Recording:
    """A reference model whose forwards are recorded; every other attribute is the model's."""

    def __init__(self, model):
        self._model = model
        self.rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (positions, ids, logits)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def _keep(self, positions, ids, logits) -> None:
        self.rows.append((positions.clone(), ids.clone(), logits.detach().float().clone()))

    def forward(self, ids, *args, **kwargs):
        out = self._model.forward(ids, *args, **kwargs)
        if isinstance(ids, torch.Tensor):  # LLaDA2 / SDAR: one row over positions 0..n-1
            self._keep(torch.arange(ids.numel()), ids, out)
        else:  # ReferenceModel: rows of (ids, positions)
            for row_ids, row_pos, logits in zip(ids, args[0], out):
                self._keep(row_pos, row_ids, logits)
        return out

    def forward_window(self, ids, start, *args, **kwargs):
        out = self._model.forward_window(ids, start, *args, **kwargs)
        self._keep(torch.arange(start, start + ids.numel()), ids, out[0])
        return out


def expected(rec: Recording, prompt_len: int, ids: list[int], top: int, shifted: bool) -> list:
    """Per token of ``ids`` (the generation from position ``prompt_len``): (logprob, top ids, top
    log-probs) from the row that committed it, or None where no recorded forward did."""
    out = []
    for j, token in enumerate(ids):
        p = prompt_len + j
        row = None
        for positions, row_ids, logits in rec.rows:
            hit = (positions == p).nonzero()
            if hit.numel() == 0 or int(row_ids[hit[0, 0]]) == token:
                continue
            i = int(hit[0, 0])
            row = logits[max(i - 1, 0) if shifted else i]
        if row is None:
            out.append(None)
            continue
        out.append(entry(row, token, top))
    return out


def from_rows(rows: list, ids: list[int], top: int) -> list:
    """``expected``'s entries from one logits row per token (None: none), as a reference decoder
    that names its commit rows gives them (``reference.blockbatch``'s ``commit_rows``)."""
    out = []
    for row, token in zip(rows, ids):
        if row is None:
            out.append(None)
            continue
        out.append(entry(row, token, top))
    return out


def assert_close(got, want, what: str, atol: float = 1e-4, filled_after: int | None = None) -> None:
    """Engine ``Generation.logprobs`` against ``expected``: values within ``atol``, top ids equal
    (where two alternatives' values tie within ``atol`` their order may differ: compared as sets).
    ``filled_after``: the index of the generation's first EOS; a decoder may fill the positions after
    it without reading them (an early stop), and such a position has no values (NaN)."""
    assert got is not None and len(got) == len(want), what
    for j, (g, w) in enumerate(zip(got, want)):
        if filled_after is not None and j > filled_after and math.isnan(g.logprob):
            continue
        if w is None:
            assert math.isnan(g.logprob), f"{what}: token {j} was committed by no forward, got {g}"
            continue
        lp, ids, vals = w
        assert abs(g.logprob - lp) <= atol, f"{what}: token {j} logprob {g.logprob} != {lp}"
        assert len(g.top) == len(ids), what
        for (gi, gv), wv in zip(g.top, vals):
            assert abs(gv - wv) <= atol, f"{what}: token {j} top {g.top} != {list(zip(ids, vals))}"
        tied = any(abs(a - b) <= atol for a, b in zip(vals, vals[1:]))
        got_ids = [i for i, _ in g.top]
        assert (sorted(got_ids) == sorted(ids)) if tied else got_ids == ids, f"{what}: token {j} top ids"


def entry(row: torch.Tensor, token: int, top: int) -> tuple[float, list[int], list[float]]:
    """One token's expected entry from the logits row that committed it: its log-prob under the row's
    float32 log-softmax and the ``top`` most probable (ids, log-probs)."""
    ls = torch.log_softmax(row.float(), -1)
    v, k = torch.topk(ls, top)
    return float(ls[token]), k.tolist(), v.tolist()
