"""``Engine``: load a checkpoint once, decode prompts with any policy in the native op."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, overload

import torch

from .errors import RequestError, checked_int, typed_error
from .loading import load_checkpoint
from .native import NativeModel
from .decoding import TokenLogprob, run_decode, run_decode_batch, token_logprobs
from .options import MAX_N, DecodeOptions, seed_for_choice
from .options_fields import DecodeStats
from .tokenization import TextCodec

# The dtypes a checkpoint loads in, by the names the CLI and the server's replicas take.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def batches_on(device_type: str) -> bool:
    """Whether the batching scheduler runs on a ``device_type`` model: always on the CPU; on CUDA
    unless ``BLOCKBATCH_CUDA_BATCHING`` is 0 (the default, graphs: packed steps replayed from CUDA
    graphs; 1: eager packed steps; a bad value raises ValueError naming the variable)."""
    if device_type == "cpu":
        return True
    from . import settings

    return device_type == "cuda" and settings.value("BLOCKBATCH_CUDA_BATCHING") != "0"


@dataclasses.dataclass
class Generation:
    """One decoded request."""

    text: str  # generation trimmed at the first EOS / end-of-turn ("" without tokenizer)
    ids: list[int]  # generated ids, trimmed the same way
    raw_ids: list[int]  # all gen_length generated ids
    prompt_ids: list[int]
    stats: DecodeStats  # one key per row of blockbatch.contract.STATS: nfe, ..., committed_per_step, branches
    # With the ``logprobs`` option: one entry per token of ``ids`` (docs/ALGORITHMS.md "Logprobs":
    # the raw model distribution of the forward that committed the token); None when off.
    logprobs: list[TokenLogprob] | None = None


class Engine:
    """A model held by the native engine plus its tokenizer.

    >>> engine = Engine.from_pretrained()                      # the shipped toy model
    >>> engine.generate("72-2=__-3=__-3=__...............?", DecodeOptions(policy="blockbatch", gen_length=128))
    """

    def __init__(
        self,
        checkpoint,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        model: NativeModel | None = None,
    ):
        """``model``: a NativeModel already built from ``checkpoint.config`` on ``device`` (e.g. random
        weights made on the GPU for a benchmark); None builds it from ``checkpoint.weights``.
        ``checkpoint`` is a loaded ``blockbatch.loading.Checkpoint``; to load a folder, use
        ``Engine.from_pretrained(path)``."""
        from .loading import Checkpoint

        if not isinstance(checkpoint, Checkpoint):
            hint = (
                f"Engine.from_pretrained({checkpoint!r})"
                if isinstance(checkpoint, (str, os.PathLike))
                else "Engine.from_pretrained(path)"
            )
            raise TypeError(
                f"checkpoint must be a loaded Checkpoint (blockbatch.loading.load_checkpoint), got "
                f"{type(checkpoint).__name__}: to load a checkpoint folder use {hint}"
            )
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but no CUDA device is available")
        self.model = (
            model if model is not None else NativeModel.from_checkpoint(checkpoint, dtype=dtype, device=self.device)
        )
        self.last_batch_stats: dict | None = None  # the last generate's batch counters (packed forwards, ...);
        # None after a generate that decoded one by one
        self._step_curve: list[tuple[int, float]] | None = None
        self.codec = (
            TextCodec(checkpoint.tokenizer, self.config, checkpoint.chat_template)
            if checkpoint.tokenizer is not None
            else None
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        check_finite: bool | None = None,
    ) -> "Engine":
        """Load a Hugging Face checkpoint folder of any registered family (``blockbatch.families``: LLaDA,
        Dream, LLaDA2; the family follows from ``config.json``'s ``model_type``); ``None`` loads the toy
        model shipped in the package. ``check_finite=False`` skips the NaN / Inf check of the weights
        (about 0.15-0.25 s per GB; None: the BLOCKBATCH_CHECK_FINITE environment variable, default on)."""
        if path is None:
            from .toy import checkpoint_path

            path = checkpoint_path()
        return cls(load_checkpoint(path, check_finite=check_finite), device, dtype)

    def encode(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        chat: bool | None = None,
        allow_unknown: bool = False,
        name: str = "prompt",
    ) -> torch.Tensor:
        """Token ids of one prompt: text (through the chat template by default when the checkpoint
        has one), a sequence of ints, or a 1-D int64 tensor. ``name`` is used in error messages.
        Token ids outside [0, vocab_size) raise ``ValueError`` naming the entry (``prompt[3]``).

        Text with characters outside the tokenizer's vocabulary raises ``ValueError`` naming them
        and their positions; ``allow_unknown=True`` encodes them as the unknown token instead.
        """
        if isinstance(prompt, str):
            if self.codec is None:
                raise ValueError(f"{name}: this checkpoint has no tokenizer.json: pass token ids instead of text")
            try:
                ids = torch.tensor(self.codec.encode(prompt, chat, allow_unknown=allow_unknown), dtype=torch.long)
            except ValueError as e:  # the same kind of error, naming the prompt
                raise type(e)(f"{name}: {e}") from None
        elif isinstance(prompt, torch.Tensor):
            if prompt.dtype != torch.long:
                raise TypeError(f"{name}: prompt token ids must be int64, got {prompt.dtype}")
            if prompt.dim() != 1:
                raise ValueError(f"{name}: a prompt tensor must be 1-D, got shape {tuple(prompt.shape)}")
            ids = prompt.cpu()
            outside = ((ids < 0) | (ids >= self.config.vocab_size)).nonzero()
            if outside.numel():
                i = int(outside[0])
                self._outside(name, i, int(ids[i]))
        elif isinstance(prompt, (list, tuple)):
            for i, token in enumerate(prompt):
                if not _is_token_id(token):
                    raise TypeError(
                        f"{name}[{i}] must be an integer token id, got {type(token).__name__} {_short(token)}"
                    )
                if not 0 <= int(token) < self.config.vocab_size:  # also before an int past int64 overflows
                    self._outside(name, i, int(token))
            ids = torch.tensor([int(i) for i in prompt], dtype=torch.long)
        else:
            raise TypeError(
                f"{name} must be a str, a list of token ids or a 1-D int64 tensor, got {type(prompt).__name__}"
            )
        if ids.numel() == 0:
            raise RequestError(f"{name}: prompt is empty", "invalid_prompt", "prompt_ids")
        return ids

    def encode_chat(
        self, messages: Sequence[dict], tools: Sequence[dict] | None = None, allow_unknown: bool = False
    ) -> torch.Tensor:
        """Token ids of a conversation (``[{"role": ..., "content": ...}, ...]``; an assistant turn may
        carry OpenAI's ``tool_calls``, a ``tool`` turn a call's result) through the chat template,
        with OpenAI-shaped ``tools`` given to it. ValueError naming ``tools`` when tools are given and
        the template does not render them (the model would never hear of them); the calls in a
        reply are read by ``blockbatch.tools.parse_reply``."""
        if self.codec is None or self.codec.chat_template is None:
            raise ValueError("messages: this checkpoint has no chat template (tokenizer_config.json chat_template)")
        if tools and not self.codec.renders_tools:
            raise RequestError(
                "tools: this checkpoint's chat template does not render tools, so the model cannot be told of them",
                "unsupported",
                "tools",
            )
        ids = self.codec.encode_chat(messages, allow_unknown, tools=tools or None)
        if not ids:
            raise RequestError("messages: the chat template rendered the conversation as no tokens", "invalid_prompt")
        return torch.tensor(ids, dtype=torch.long)

    def _outside(self, name: str, i: int, token: int) -> None:
        raise RequestError(
            f"{name}[{i}] = {_short(token)} is outside the vocabulary [0, {self.config.vocab_size})",
            "invalid_prompt",
            "prompt_ids",
        )

    def canvas_length(self, prompt_length: int, options: DecodeOptions) -> int:
        """Positions a prompt of ``prompt_length`` tokens takes with ``options`` on this model: prompt +
        gen_length, for policy ``block`` rounded up to whole blocks, as decode and the scheduler admit
        it (``torch.ops.blockbatch.admit``)."""
        try:
            return torch.ops.blockbatch.admit(self.model.obj, prompt_length, options.native)[0]
        except ValueError as e:
            raise typed_error(e) from None

    def _too_long(self, i: int, ids: torch.Tensor, o: DecodeOptions) -> RequestError | None:
        """prompts[i] with ``o`` needs more positions than the model has: the error, else None."""
        limit, length = self.config.max_sequence_length, self.canvas_length(ids.numel(), o)
        if length <= limit:
            return None
        rounded = " (rounded up to whole blocks of block_length)" if length != ids.numel() + o.gen_length else ""
        return RequestError(
            f"prompts[{i}]: its prompt ({ids.numel()} tokens) plus gen_length ({o.gen_length}) needs "
            f"{length} positions{rounded} but the model's max_sequence_length is {limit} (shorten the prompt "
            f"or gen_length)",
            "context_length",
            "gen_length",
        )

    def generate(
        self,
        prompts: str | Sequence[int] | torch.Tensor | Iterable[str | Sequence[int] | torch.Tensor],
        options: DecodeOptions | Sequence[DecodeOptions] | None = None,
        chat: bool | None = None,
        progress: bool = False,
        allow_unknown: bool = False,
        max_batch: int = 1,
        kv_budget_bytes: int = 0,
        prefix_cache: bool = False,
        n: int = 1,
    ) -> list[Generation]:
        """Decode each prompt (text, a list of ids, or a 1-D/2-D int64 tensor); results in input order.

        ``n`` (1 to ``MAX_N``): generations per prompt, in order (prompt 0's n, then prompt 1's, ...);
        generation i of a prompt decodes with ``seed + i`` (``seed_for_choice``), so with temperature
        > 0 they are n draws, and with temperature 0 (and no other seeded choice: Dream's
        ``alg="origin"`` or ``alg_temp``) they are n equal greedy decodes. They are n requests like
        any others: with ``max_batch`` > 1 they share packed forwards.

        ``prompts`` is one prompt or a list / tuple of prompts; anything else (a dict, a set, a
        generator of characters, bytes) raises ``TypeError`` naming the argument. ``options`` is
        one DecodeOptions for every prompt or a list with one per prompt. ``max_batch`` > 1 (where
        ``batches``) decodes up to that many requests together, their forwards packed into one per step
        (``torch.ops.blockbatch.decode_batch``; ``kv_budget_bytes`` caps their shared KV pool, 0:
        room for ``max_batch`` requests). Either way a request's result never depends on the
        others: batched, its tokens and counters are those of its decode alone. ``prefix_cache``
        (block-causal families, policy ``block``: LLaDA2): the prompts go through one scheduler
        (``max_batch`` at a time, also 1) whose KV pool keeps the complete prompt blocks of every
        request once its first forward has written them, and a request admitted later whose prompt
        starts with the same blocks reads their K/V instead of computing them: the same tokens and
        NFE, fewer query tokens (``stats["prefix_cache_hit_tokens"]``; docs/ALGORITHMS.md 12.6).
        With the default budget the pool also has room for the blocks two or more of ``prompts``
        start with (at most the larger of the running requests' size and 1 GiB); a
        ``kv_budget_bytes`` given holds both. The cache lives for this call: for one that lasts
        across calls, submit to a long-lived ``Engine.scheduler(prefix_cache=True)``. Other
        families: no effect.
        """
        max_batch = checked_int("max_batch", max_batch, 1)
        kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
        if not isinstance(prefix_cache, bool):
            raise TypeError(f"prefix_cache must be True or False, got {prefix_cache!r}")
        n = checked_int("n", n, 1, MAX_N)
        encoded, opts = self._requests(prompts, options, chat, allow_unknown)
        if n > 1:
            opts = [seed_for_choice(o, i, n) for o in opts for i in range(n)]
            encoded = [ids for ids in encoded for _ in range(n)]
        for i, (ids, o) in enumerate(zip(encoded, opts)):  # before any decodes
            too_long = self._too_long(i, ids, o)
            if too_long is not None:
                raise too_long
        if (max_batch > 1 or prefix_cache) and len(encoded) > 1 and self.batches:
            results, self.last_batch_stats = run_decode_batch(
                self.model.obj,
                encoded,
                opts,
                max_batch,
                kv_budget_bytes,
                self.step_curve if any(_adaptive(o) for o in opts) else None,
                prefix_cache=prefix_cache,
            )
        else:
            results, self.last_batch_stats = None, None  # one by one: no batch, so no batch counters
        out = []
        bar = _Progress(len(encoded)) if progress and len(encoded) > 1 else None
        for i, ids in enumerate(encoded):
            result = results[i] if results is not None else self._decode_alone(ids, opts[i])
            out.append(self._generation(ids, result))
            if bar:
                bar.update(result.stats)
        if bar:
            bar.close()
        return out

    def _decode_alone(self, ids: torch.Tensor, o: DecodeOptions):
        """One request by itself. ``branch_budget="auto"`` keeps the branches the scheduler would
        give it admitted alone (load 1, on this model's step curve; the rule lives in C++,
        csrc/decode/budget.h), so auto means the same with or without a batch."""
        return run_decode(self.model.obj, ids.to(self.device), o, self.step_curve if _adaptive(o) else None)

    def default_options(self, **overrides) -> DecodeOptions:
        """The decode options of a request that gives none: the options table's defaults under the
        model family's own (LLaDA2: policy 'block', threshold 0.95), under ``overrides``."""
        from . import families

        return DecodeOptions(**{**families.default_options(self.config), **overrides})

    @overload
    def _requests(
        self, prompts, options, chat, allow_unknown, keep_errors: Literal[False] = False
    ) -> tuple[list[torch.Tensor], list[DecodeOptions]]: ...

    @overload
    def _requests(
        self, prompts, options, chat, allow_unknown, keep_errors: Literal[True]
    ) -> tuple[list[torch.Tensor | ValueError], list[DecodeOptions]]: ...

    def _requests(
        self, prompts, options, chat, allow_unknown, keep_errors: bool = False
    ) -> tuple[Sequence[torch.Tensor | ValueError], list[DecodeOptions]]:
        """generate / stream's arguments checked: the prompts encoded, one DecodeOptions each.
        ``keep_errors``: a prompt that fails to encode with ValueError (bad ids, unknown
        characters) is that error in the list instead of raised (stream makes it its item)."""
        if isinstance(options, (list, tuple)):
            per_prompt = list(options)
            for i, o in enumerate(per_prompt):
                if not isinstance(o, DecodeOptions):
                    raise TypeError(f"options[{i}] must be a DecodeOptions, got {type(o).__name__}")
        else:
            options = self.default_options() if options is None else options
            if not isinstance(options, DecodeOptions):
                raise TypeError(f"options must be a DecodeOptions or a list of them, got {type(options).__name__}")
            per_prompt = None
        if (
            isinstance(prompts, str)
            or (isinstance(prompts, torch.Tensor) and prompts.dim() == 1)
            or (isinstance(prompts, (list, tuple)) and prompts and all(_is_token_id(t) for t in prompts))
        ):
            prompts = [prompts]
        elif isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts: a prompt tensor must be 1-D or 2-D, got shape {tuple(prompts.shape)}")
            prompts = list(prompts)
        elif isinstance(prompts, (list, tuple)):
            prompts = list(prompts)
        else:
            raise TypeError(
                f"prompts must be a str, a list of token ids, an int64 tensor or a list of those, got "
                f"{type(prompts).__name__}"
            )
        if not prompts:
            raise ValueError("prompts is empty: pass at least one prompt")
        if per_prompt is not None and len(per_prompt) != len(prompts):
            raise ValueError(
                f"options: {len(per_prompt)} DecodeOptions for {len(prompts)} prompts (give one, or one per prompt)"
            )
        encoded: list[torch.Tensor | ValueError] = []
        for i, p in enumerate(prompts):
            try:
                encoded.append(
                    self.encode(
                        p, chat, allow_unknown=allow_unknown, name=f"prompts[{i}]" if len(prompts) > 1 else "prompt"
                    )
                )
            except ValueError as e:
                if not keep_errors:
                    raise
                encoded.append(e)
        return encoded, per_prompt if per_prompt is not None else [options] * len(encoded)

    def _generation(self, ids: torch.Tensor, result) -> Generation:
        raw = result.tokens[ids.numel() :].tolist()
        trimmed = self._trim(raw)
        logprobs = token_logprobs(trimmed, result.logprobs) if result.logprobs is not None else None
        return Generation(
            self.codec.decode(trimmed) if self.codec else "", trimmed, raw, ids.tolist(), result.stats, logprobs
        )

    def _trim(self, raw: list[int]) -> list[int]:
        return self.codec.trim(raw) if self.codec else _trim_eos(raw, self.config.eos_token_id)

    @property
    def step_curve(self) -> list[tuple[int, float]]:
        """Seconds of one packed forward by query tokens on this model (measured once, in at most a
        second, then kept): what ``branch_budget="auto"`` requests read under load."""
        if self._step_curve is None:
            tokens, seconds = torch.ops.blockbatch.measure_step_curve(self.model.obj, 1.0)
            self._step_curve = list(zip(tokens, seconds))
        return self._step_curve

    @property
    def batches(self) -> bool:
        """Whether requests decode together through the scheduler on this engine's device
        (``batches_on``), else one by one."""
        return batches_on(self.device.type)

    def scheduler(
        self,
        max_batch: int = 8,
        max_length: int | None = None,
        kv_budget_bytes: int = 0,
        adaptive: bool = True,
        kv_page_len: int = -1,
        prefix_cache: bool = False,
    ):
        """A ``BatchScheduler`` on this model (CPU; CUDA where ``batches``): submit requests at any
        time, each decoding with the others in one packed forward per step (``blockbatch.scheduler``).
        ``max_length``: the longest prompt + gen_length it accepts (default: the model's ``max_sequence_length``, at
        most 4096). ``adaptive``: give it the model's step-time curve (``step_curve``, measured on
        first use) for ``branch_budget="auto"`` requests; False: they run their full branch set.
        ``kv_page_len``: the KV pool's layout (-1 automatic: pages of 16 positions on the CPU, dense
        rows on CUDA; 0 dense rows; > 0 pages of that many positions; ``BatchScheduler``).
        ``prefix_cache``: block-causal requests reuse the K/V of earlier requests' complete prompt
        blocks (``BatchScheduler``; docs/ALGORITHMS.md 12.6)."""
        if not self.batches:
            raise ValueError(
                f"the batching scheduler on {self.device} is off (BLOCKBATCH_CUDA_BATCHING=0): set "
                f"BLOCKBATCH_CUDA_BATCHING=1 or unset it, or decode one by one with Engine.generate"
            )
        from .scheduler import BatchScheduler

        max_batch = checked_int("max_batch", max_batch, 1)
        kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
        if max_length is None:
            max_length = min(self.config.max_sequence_length, 4096)
        max_length = checked_int("max_length", max_length, 2, self.config.max_sequence_length)
        return BatchScheduler(
            self.model.obj,
            max_batch=max_batch,
            max_length=max_length,
            kv_budget_bytes=kv_budget_bytes,
            step_curve=self.step_curve if adaptive else None,
            kv_page_len=kv_page_len,
            prefix_cache=prefix_cache,
        )

    def kv_report(self, options: DecodeOptions, prompt_length: int, kv_budget_bytes: int) -> dict[str, int]:
        """KV memory per request (rows, bytes per row, bytes per request) with ``options`` and a
        ``prompt_length``-token prompt, and the largest batch ``kv_budget_bytes`` holds (-1: the
        policy keeps no KV)."""
        from .scheduler import kv_report

        prompt_length = checked_int("prompt_length", prompt_length, 1)
        kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
        return kv_report(self.model.obj, options, prompt_length, kv_budget_bytes)

    def stream(
        self,
        prompts,
        options: DecodeOptions | Sequence[DecodeOptions] | None = None,
        chat: bool | None = None,
        allow_unknown: bool = False,
        max_batch: int = 8,
        kv_budget_bytes: int = 0,
        blocks: bool = False,
    ) -> Iterator["StreamItem"]:
        """Decode the prompts together (as ``generate`` with ``max_batch``) and yield each result as
        it finishes: ``StreamItem(index, generation=...)``, or ``StreamItem(index, error=...)`` for
        a request that failed (the others go on). ``blocks=True`` also yields the generation's stable
        prefix each time it grows (``generation`` None, ``new_ids`` the ids added, ``text`` the
        prefix so far): a diffusion decode commits out of order, so only tokens that can no longer
        change are shown. Closing the generator early cancels the requests still running. Where the
        engine does not ``batches`` (CUDA with ``BLOCKBATCH_CUDA_BATCHING=0``) the requests
        decode one by one, in order. A prompt that cannot be decoded (bad ids, more positions
        than the model's max_sequence_length) is an error item; the others go on."""
        max_batch = checked_int("max_batch", max_batch, 1)
        kv_budget_bytes = checked_int("kv_budget_bytes", kv_budget_bytes, 0)
        encoded, opts = self._requests(prompts, options, chat, allow_unknown, keep_errors=True)
        refused = {}  # index -> its error, yielded first
        for i, (ids, o) in enumerate(zip(encoded, opts)):
            error = ids if isinstance(ids, ValueError) else self._too_long(i, ids, o)
            if error is not None:
                refused[i] = error
        if not self.batches:
            for i, ids in enumerate(encoded):
                if i in refused:
                    yield StreamItem(i, error=refused[i])
                    continue
                assert isinstance(ids, torch.Tensor)  # a prompt that failed to encode is in refused
                try:
                    result = self._decode_alone(ids, opts[i])
                except (ValueError, RuntimeError, TimeoutError) as e:
                    yield StreamItem(i, error=e)
                    continue
                yield StreamItem(i, generation=self._generation(ids, result))
            return
        import queue as queue_module

        for i, error in refused.items():
            yield StreamItem(i, error=error)
        # the prompts left, by index (every one encoded: those that failed to are in refused)
        todo = {i: ids for i, ids in enumerate(encoded) if i not in refused and isinstance(ids, torch.Tensor)}
        if not todo:
            return
        events: queue_module.SimpleQueue = queue_module.SimpleQueue()
        # Every request left fits the model (_too_long), so the pool's rows do too.
        max_length = max(2, max(self.canvas_length(todo[i].numel(), opts[i]) for i in todo))
        with self.scheduler(
            min(max_batch, len(todo)), max_length, kv_budget_bytes, adaptive=any(_adaptive(opts[i]) for i in todo)
        ) as sched:
            index = {}
            for i in todo:
                ids, o = todo[i], opts[i]
                try:
                    request = sched.submit(ids, o, stream=blocks, callback=events.put)
                except ValueError as e:
                    yield StreamItem(i, error=ValueError(f"prompts[{i}]: {e}"))
                    continue
                index[request.id] = (i, request)
            left = len(index)
            while left:
                event = events.get()
                i, request = index[event.request_id]
                if event.kind == "tokens":
                    trimmed = self._trim(request.stable_ids)
                    yield StreamItem(i, new_ids=event.tokens, text=self.codec.decode(trimmed) if self.codec else "")
                    continue
                left -= 1
                if event.kind == "finished":
                    yield StreamItem(i, generation=self._generation(todo[i], event.output))
                else:
                    yield StreamItem(i, error=event.error)


@dataclasses.dataclass
class StreamItem:
    """One item of ``Engine.stream``: a finished request (``generation``), a failed one
    (``error``), or (``blocks=True``) a request's stable prefix grown by ``new_ids``."""

    index: int  # the prompt's position in the call's prompts
    generation: Generation | None = None
    error: BaseException | None = None
    new_ids: list[int] = dataclasses.field(default_factory=list)
    text: str = ""  # blocks: the stable prefix's text (trimmed at EOS)

    @property
    def done(self) -> bool:
        return self.generation is not None or self.error is not None


def _adaptive(o: DecodeOptions) -> bool:
    from . import policies

    return policies.get(o.policy).MULTI_BRANCH and o.branch_budget == "auto"


def _is_token_id(value: Any) -> bool:
    """An int-like token id (int, numpy integer, 0-d integer tensor), never a bool or float."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.dtype.is_floating_point and value.dtype != torch.bool
    return hasattr(value, "__index__") and type(value).__module__ == "numpy" and "bool" not in type(value).__name__


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _trim_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


class _Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int):
        self.total, self.done, self.start, self.nfe = total, 0, time.perf_counter(), 0

    def update(self, stats: Mapping[str, Any]) -> None:
        self.done += 1
        self.nfe += stats["nfe"]
        elapsed = time.perf_counter() - self.start
        width = 30
        filled = int(width * self.done / self.total)
        eta = elapsed / self.done * (self.total - self.done)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"mean NFE {self.nfe / self.done:.1f}  {elapsed:.1f}s elapsed, ETA {eta:.1f}s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
