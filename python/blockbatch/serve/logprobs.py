"""The ``logprobs`` of a response in OpenAI's shapes, from the engine's per-token rows (the
``logprobs`` decode option: docs/ALGORITHMS.md "Logprobs"; each row is the token's log-probability
and its top alternatives in the raw model distribution of the forward that committed it).

- completions: ``{"tokens", "token_logprobs", "top_logprobs": [{token text: logprob}], "text_offset"}``;
- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}``.

A token's text is its piece of the decoded text (the text of the first i + 1 tokens less that of the
first i), so the pieces of a choice join into its text; an alternative's text is that token decoded
alone. A stream's chunk carries the entries of the tokens whose text it completes (``covered``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch


def covered(codec, ids: Sequence[int], chars: int) -> int:
    """The most leading ``ids`` whose text fits in ``chars`` characters."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(codec.decode(list(ids[:mid]))) <= chars:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _number(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no NaN / -inf: a token no step committed


class Entries:
    """The entries of tokens ``[start, end)`` of a choice's generation ``ids`` with their rows."""

    def __init__(self, codec, ids: Sequence[int], rows: torch.Tensor | Sequence[Sequence[float]], start: int, end: int):
        table = rows.tolist() if isinstance(rows, torch.Tensor) else [list(r) for r in rows]
        self.k = (len(table[0]) - 1) // 2 if table else 0
        prefix = codec.decode(list(ids[:start]))
        self.offset0 = len(prefix)
        self.pieces: list[str] = []
        for i in range(start, end):
            text = codec.decode(list(ids[: i + 1]))
            self.pieces.append(text[len(prefix) :])
            prefix = text
        self.rows = table[start:end]
        self.codec = codec

    def _alternatives(self, row: list[float]) -> list[tuple[str, float | None]]:
        k = self.k
        pairs = zip(row[1 : 1 + k], row[1 + k :])
        return [(self.codec.decode([int(i)]), _number(v)) for i, v in pairs if math.isfinite(i)]

    def completion(self) -> dict[str, Any]:
        offsets, at = [], self.offset0
        for piece in self.pieces:
            offsets.append(at)
            at += len(piece)
        return {
            "tokens": self.pieces,
            "token_logprobs": [_number(r[0]) for r in self.rows],
            "top_logprobs": [dict(self._alternatives(r)) for r in self.rows],
            "text_offset": offsets,
        }

    def chat(self) -> dict[str, Any]:
        def entry(text: str, logprob: float | None) -> dict[str, Any]:
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        content = []
        for piece, r in zip(self.pieces, self.rows):
            e = entry(piece, _number(r[0]))
            e["top_logprobs"] = [entry(t, v) for t, v in self._alternatives(r)]
            content.append(e)
        return {"content": content}

    def body(self, chat: bool) -> dict[str, Any]:
        return self.chat() if chat else self.completion()
