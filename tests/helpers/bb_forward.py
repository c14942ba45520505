"""Checks the bb_forward binary's output against the Python model on the same batch."""

from __future__ import annotations

import re

import torch


def assert_forward_matches(stdout: str, model, vocab_size: int, mode: str, lengths: list[int], L: int) -> None:
    """bb_forward's printed logits statistics (shape, mean, std, argmax of row 0) and its result
    line equal the Python NativeModel's forward of the same tokens (ids 7919 * i mod vocab)."""
    stats = re.search(r"logits shape=\[(\d+), (\d+)\] mean=(\S+) std=(\S+) argmax\[0\]=(\d+)", stdout)
    assert stats and re.search(r"^result mode=" + mode + r" .* ms_median=\S+ tokens_per_s=\S+$", stdout, re.M)
    T = sum(lengths)
    tokens = (torch.arange(T) * 7919) % vocab_size
    ids = list(torch.split(tokens, lengths))
    start = (lambda n: 0) if mode == "full" else (lambda n: L - n)
    pos = [torch.arange(start(n), start(n) + n) for n in lengths]
    kv = model.new_kv(len(lengths), L) if mode != "full" else None
    prefix = [L - n for n in lengths] if mode == "prefix" else None
    logits = torch.cat(model.forward(ids, pos, kv, mode, prefix_lens=prefix))
    assert (int(stats[1]), int(stats[2])) == tuple(logits.shape)
    assert abs(float(stats[3]) - logits.mean().item()) < 1e-5
    assert abs(float(stats[4]) - logits.std().item()) < 1e-5
    assert int(stats[5]) == int(logits[0].argmax())
