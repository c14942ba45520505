"""Policy ``wavefront`` in plain PyTorch, float32: FlowBlock's gated wavefront decoding (issue 54,
docs/ALGORITHMS.md 15) on LLaDA2 checkpoints with token editing (LLaDA2.1), written from the spec to be
read: the oracle for csrc/decode/policies/wavefront.cpp.

The spec. Blocks of ``block_length`` are aligned at absolute position 0. A request holds a window of
1..``max_active_blocks`` adjacent *active* blocks after its frozen prefix (the prompt and the committed
blocks). Each step is one forward over every active block: block ``i`` attends the frozen prefix and the
active blocks ``<= i`` (block-causal), the prefix's K/V taken from the cache (exact: written once its
tokens are final). In every active block the LLaDA2.1 rule applies, decided on the canvas as the step
found it: the masks rated ``> threshold`` are committed (at least the most confident one), and every
generated decided token whose proposal differs with confidence ``> edit_threshold`` is replaced.

* The oldest block commits (leaves the window for the prefix) after a step that began without masks in
  it and edited nothing in it; the next block may then commit in the same step by the same rule. Before a
  step, every active block without masks counts a post step, and the oldest commits once it counted more
  than ``max_post_steps``.
* Before a step, while the window has room and blocks remain, a new block enters at its end when the
  readiness gate fires on the youngest active block: ``gate="decoded"`` (the rule): the decoded share of
  its generated positions is ``>= spawn_threshold``; ``gate="confidence"`` (measured against it,
  benchmarks/bench_wavefront.py): the mean confidence of its latest proposals is. The window never
  empties while blocks remain.
* ``stop_on_eos``: the first committed block whose generation so far holds EOS and no mask ends the
  request; the drafts after it are dropped (masks again).

With ``max_active_blocks=1`` this is ``reference.llada2.block_generate`` with editing, step for step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .llada2 import LLaDA2Reference

GATES = ("decoded", "confidence")


def wavefront_generate(
    model: LLaDA2Reference,
    prompt: torch.Tensor,
    *,
    gen_length: int,
    block_length: int = 32,
    threshold: float = 0.95,
    edit_threshold: float,
    max_post_steps: int = 16,
    max_active_blocks: int = 2,
    spawn_threshold: float = 0.5,
    stop_on_eos: bool = False,
    eos_id: int,
    mask_id: int,
    vocab_limit: int | None = None,
    gate: str = "decoded",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Decode ``prompt`` (1-D int64) by the wavefront. Returns the canvas (prompt + ``gen_length``) and
    stats: ``nfe``, ``edits``, ``redrafted_tokens`` (edits of tokens written while an older block was in
    flight), ``blocks_in_flight`` (active blocks summed over the forwards), ``max_blocks_in_flight``,
    ``window_per_step``, ``committed_per_step`` and ``query_tokens``."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    B, P = block_length, prompt.numel()
    n_blocks = -(-(P + gen_length) // B)
    x = torch.full((n_blocks * B,), mask_id, dtype=torch.long)
    x[:P] = prompt
    written_stale = torch.zeros(n_blocks * B, dtype=torch.bool)

    window: list[int] = [P // B]  # the active blocks, oldest first
    post = [0] * n_blocks
    latest_conf: dict[int, torch.Tensor] = {}  # block -> its confidences at its latest forward
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # final K/V of positions < cached
    cached = 0
    stats: dict[str, Any] = dict(
        nfe=0,
        edits=0,
        redrafted_tokens=0,
        blocks_in_flight=0,
        max_blocks_in_flight=0,
        window_per_step=[],
        committed_per_step=[],
        query_tokens=[],
    )

    def span(b: int) -> slice:
        return slice(b * B, (b + 1) * B)

    def generated(b: int) -> torch.Tensor:  # the block's positions after the prompt
        return torch.arange(b * B, (b + 1) * B) >= P

    def ready(b: int) -> bool:
        gen = generated(b)
        if gate == "decoded":
            decoded = int(((x[span(b)] != mask_id) & gen).sum())
            return decoded >= spawn_threshold * int(gen.sum())
        conf = latest_conf.get(b)
        mean = float(conf[gen].mean()) if conf is not None else 0.0
        return mean >= spawn_threshold

    def commit_oldest() -> None:
        """The oldest block joins the prefix; the request may end there (stop_on_eos)."""
        b = window.pop(0)
        text = x[P : (b + 1) * B]
        if stop_on_eos and bool((text == eos_id).any()) and not bool((text == mask_id).any()):
            x[(b + 1) * B :] = mask_id
            window.clear()
            return
        if not window and b + 1 < n_blocks:
            window.append(b + 1)

    def before_step() -> None:
        for b in window:
            if not bool((x[span(b)] == mask_id).any()):
                post[b] += 1
        while window and post[window[0]] > max_post_steps:
            commit_oldest()
        while window and len(window) < max_active_blocks and window[-1] + 1 < n_blocks and ready(window[-1]):
            window.append(window[-1] + 1)

    before_step()
    while window:
        # One forward: queries from the first position whose K/V are not final, each block attending
        # the cache and the blocks up to its own (forward_window's block-causal mask).
        end = (window[-1] + 1) * B
        out, own = model.forward_window(x[cached:end], cached, B, kv)
        stats["nfe"] += 1
        stats["query_tokens"].append(end - cached)
        final = window[0] * B - cached  # rows of blocks before the oldest active one: final K/V now
        fresh = [(k[:, :final], v[:, :final]) for k, v in own]
        kv = (
            fresh if kv is None else [(torch.cat([a, k], 1), torch.cat([b, v], 1)) for (a, b), (k, v) in zip(kv, fresh)]
        )
        cached = window[0] * B
        logits = out[final:].float()
        scored = logits if vocab_limit is None else logits[:, :vocab_limit]
        proposal = scored.argmax(dim=-1)
        confidence = F.softmax(logits, dim=-1).gather(-1, proposal[:, None])[:, 0]

        stats["blocks_in_flight"] += len(window)
        stats["max_blocks_in_flight"] = max(stats["max_blocks_in_flight"], len(window))
        stats["window_per_step"].append(len(window))
        decisions = []  # per active block: (commit mask, edit mask, settled)
        for k, b in enumerate(window):
            old = x[span(b)].clone()
            tok, conf = proposal[k * B : (k + 1) * B], confidence[k * B : (k + 1) * B]
            latest_conf[b] = conf
            masked = old == mask_id
            commit = torch.zeros(B, dtype=torch.bool)
            if masked.any():
                rated = torch.where(masked, conf, torch.tensor(float("-inf")))
                commit = masked & (rated > threshold)
                if not commit.any():
                    commit = torch.zeros(B, dtype=torch.bool)
                    commit[torch.topk(rated, k=1).indices] = True
                if not bool((tok[commit] != mask_id).any()):
                    raise RuntimeError(f"block {b}: the model proposes the mask id for every mask left")
            editable = ~masked & generated(b)
            edit = editable & (conf > edit_threshold) & (tok != old)
            decisions.append((commit, edit, not bool(masked.any()) and not bool(edit.any())))
        committed = 0
        for k, (b, (commit, edit, _)) in enumerate(zip(window, decisions)):
            tok = proposal[k * B : (k + 1) * B]
            where = torch.arange(b * B, (b + 1) * B)
            stats["edits"] += int(edit.sum())
            stats["redrafted_tokens"] += int((written_stale[where] & edit).sum())
            committed += int((commit & (tok != mask_id)).sum())
            change = commit | edit
            x[where[change]] = tok[change]
            written_stale[where[change]] = k > 0
        stats["committed_per_step"].append(committed)
        settled = [s for _, _, s in decisions]
        while window and settled and settled[0]:
            settled.pop(0)
            commit_oldest()
        before_step()
    return x[: P + gen_length].clone(), stats


def reference_entry(model: LLaDA2Reference, prompt: torch.Tensor, o, vocab_limit: int | None = None):
    """The policy's float32 reference for ``DecodeOptions`` ``o`` (``policies.wavefront.REFERENCE``):
    ``(canvas row, nfe)``; ``model`` holds the checkpoint's mask and EOS ids."""
    assert model.mask_id is not None and model.eos_id is not None
    canvas, stats = wavefront_generate(
        model,
        prompt,
        gen_length=o.gen_length,
        block_length=o.block_length,
        threshold=float("inf") if o.threshold is None else o.threshold,
        edit_threshold=o.edit_threshold,
        max_post_steps=o.max_post_steps,
        max_active_blocks=o.max_active_blocks,
        spawn_threshold=o.spawn_threshold,
        stop_on_eos=o.eos_exit,
        eos_id=model.eos_id,
        mask_id=model.mask_id,
        vocab_limit=vocab_limit,
    )
    return canvas, stats["nfe"]
