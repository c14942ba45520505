"""lm-evaluation-harness model ``blockbatch``: ``generate_until`` through the native engine.

Command line (lm-eval's own, with this model registered: the harness finds models only by
import, so run it through this module)::

    python -m blockbatch.lm_eval --model blockbatch \\
        --model_args pretrained=/path/to/LLaDA-8B-Instruct,policy=blockbatch,dtype=bfloat16,device=cuda \\
        --tasks gsm8k --apply_chat_template

In Python: ``import blockbatch.lm_eval`` registers the model, then
``lm_eval.simple_evaluate(model="blockbatch", model_args={...}, tasks=[...])``.

``model_args``:

- ``pretrained``: Hugging Face LLaDA folder (default: the toy model shipped in the package)
- ``policy``: vanilla | prefix | dual | blockbatch (default blockbatch), with the same presets as
  ``blockbatch bench`` (dual / prefix: block 32, threshold 0.9; vanilla: one token per step)
- ``preset``: instead of ``policy``, a named decode setting (``blockbatch-paper``,
  ``blockbatch-best``, ``dual-fast-dllm``: ``blockbatch.presets``) or a preset file's path; the
  other decode options given win over the preset's
- ``device`` (cpu | cuda[:N]; default cuda when available, else cpu; lm-eval's ``--device``
  lands here too, and a CUDA device asked for on a machine without one falls back to the CPU
  with a warning), ``dtype`` (float32 | bfloat16 | float16; default: the checkpoint's)
- ``gen_length``: the diffusion canvas. Default: the request's ``max_gen_toks`` rounded up to a
  multiple of every block size in use (the generation is then cut to ``max_gen_toks`` tokens)
- any other decode option of the options table (``blockbatch.contract``; ``docs/options.md``
  lists them), as in a ``blockbatch bench`` policy spec: lists as ``block_sizes=4/8/16``, ``none``
  for None; ``--help`` prints them with their defaults

Per request, ``gen_kwargs`` may set ``until`` (the text is cut at the first stop string),
``max_gen_toks``, ``temperature`` / ``do_sample`` and ``seed``; sampling knobs a diffusion decoder
does not have (top_p < 1, top_k > 0, ...) are refused by name. Loglikelihood requests raise:
masked diffusion models have no left-to-right likelihood to report.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from . import contract, policies, presets
from .bench import SPEC_OPTIONS, policy_kwargs
from .engine import Engine
from .options import DecodeOptions
from .tasks import cut_at_stops, harness_ids
from .tokenization import TextCodec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# gen_kwargs that lm-eval tasks commonly pass with a value that means "no change" here.
_NEUTRAL_GEN_KWARGS = {
    "top_p": (1.0, None),
    "top_k": (0, -1, None),
    "num_beams": (1, None),
    "repetition_penalty": (1.0, None),
}


@register_model("blockbatch")
class BlockBatchLM(LM):
    """A checkpoint in the native engine, decoding every request with one policy."""

    def __init__(
        self,
        pretrained: str | None = None,
        policy: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        gen_length: int | None = None,
        batch_size: Any = 1,
        max_batch_size: Any = None,
        preset: str | None = None,
        **options: Any,
    ):
        super().__init__()
        if policy is not None and preset is not None:
            raise ValueError(
                f"give policy or preset, not both (got policy={policy!r}, preset={preset!r}): a preset sets the policy"
            )
        if preset is not None and (not isinstance(preset, str) or not preset or ":" in preset):
            raise ValueError(f"preset must be a preset name or a preset file's path, got {preset!r}")
        if preset is not None:
            presets.get(preset)  # ValueError naming an unknown preset or a bad file
        if dtype is not None and str(dtype) not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        unknown = sorted(k for k in options if k not in SPEC_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown model_args {', '.join(map(repr, unknown))}; known: pretrained, policy, preset, "
                f"device, dtype, gen_length, {', '.join(sorted(SPEC_OPTIONS))}"
            )
        if gen_length is not None and (
            not isinstance(gen_length, int) or isinstance(gen_length, bool) or gen_length <= 0
        ):
            raise ValueError(f"gen_length must be a positive integer, got {gen_length!r}")
        # lm-eval passes batch_size to every model; requests are decoded one by one here (each
        # request's result never depends on the others), so it only has to be valid.
        del batch_size, max_batch_size
        self.policy_spec = (preset or policy or "blockbatch") + (
            ":" + ",".join(f"{k}={_spec_value(v)}" for k, v in options.items()) if options else ""
        )
        self.gen_length = gen_length
        self.options_for({})  # a bad policy or option value fails here, by name
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval passes --device (default cuda:0) to every model; follow its HF model and fall back.
            print(
                f"blockbatch: device {device!r} requested but no CUDA device is available; using the CPU",
                file=sys.stderr,
            )
            device = "cpu"
        self.engine = Engine.from_pretrained(pretrained, device, DTYPES[str(dtype)] if dtype else None)
        if self.engine.codec is None:
            raise ValueError(f"{pretrained}: no tokenizer.json; lm-eval needs text in and text out")
        self.pretrained = pretrained
        self._device = self.engine.device
        self.chat_applied = False  # set once lm-eval renders contexts with apply_chat_template
        self.totals = {"requests": 0, "nfe": 0, "generated_tokens": 0, "seconds": 0.0}

    @property
    def _codec(self) -> TextCodec:
        codec = self.engine.codec
        assert codec is not None  # __init__ refuses a checkpoint without a tokenizer
        return codec

    # -- options ---------------------------------------------------------------------------
    def options_for(self, gen_kwargs: dict) -> tuple[DecodeOptions, int | None]:
        """Decode options for one request and the token budget its generation is cut to."""
        kwargs = dict(gen_kwargs)
        kwargs.pop("until", None)
        max_gen_toks = kwargs.pop("max_gen_toks", None)
        temperature = kwargs.pop("temperature", None)
        do_sample = kwargs.pop("do_sample", None)
        seed = kwargs.pop("seed", None)
        for key, neutral in _NEUTRAL_GEN_KWARGS.items():
            if key in kwargs and kwargs.pop(key) not in neutral:
                raise ValueError(
                    f"gen_kwargs {key}={gen_kwargs[key]!r} is not supported by diffusion decoding "
                    f"(accepted: {', '.join(map(repr, neutral))})"
                )
        if kwargs:
            raise ValueError(
                f"unsupported gen_kwargs {', '.join(map(repr, sorted(kwargs)))}; supported: until, "
                f"max_gen_toks, temperature, do_sample, seed"
            )
        if max_gen_toks is not None and (not isinstance(max_gen_toks, int) or max_gen_toks <= 0):
            raise ValueError(f"gen_kwargs max_gen_toks must be a positive integer, got {max_gen_toks!r}")
        length = self.gen_length or max_gen_toks or 128
        # before rounding: a preset's block sizes whole (they are fitted to the rounded length)
        kw = policy_kwargs(self.policy_spec, length, fit=self.gen_length is not None)
        if self.gen_length is None:  # round the canvas up to a multiple of every block size in use
            engine = getattr(self, "engine", None)  # None while __init__ checks the options, before loading
            family = engine.config.family if engine is not None else contract.FAMILIES[0]
            family_sizes = contract.BY_NAME["block_sizes"].default_for("blockbatch", family)
            policy = kw.get("policy", contract.DEFAULTS["policy"])  # a preset file may leave it to the default
            sizes = policies.get(policy).unit_sizes(kw) or family_sizes
            if all(isinstance(b, int) and b > 0 for b in sizes):
                unit = math.lcm(*sizes)
                # parsed again at the rounded length, so that length-derived presets (vanilla's
                # one step per token) follow it and explicit options still override them
                kw = policy_kwargs(self.policy_spec, -(-length // unit) * unit)
        base = DecodeOptions(**kw)
        changes: dict[str, Any] = {}
        if do_sample is False or (temperature is not None and float(temperature) == 0.0):
            changes["temperature"] = 0.0
        elif temperature is not None:
            changes["temperature"] = float(temperature)
        if seed is not None:
            changes["seed"] = int(seed)
        return base.replace(**changes), max_gen_toks

    # -- lm-eval API -----------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from tqdm import tqdm

        out = []
        for request in tqdm(requests, desc="blockbatch generate_until", disable=disable_tqdm):
            context, gen_kwargs = request.args
            options, budget = self.options_for(gen_kwargs or {})
            ids = torch.tensor(harness_ids(self._codec, context, self.chat_applied), dtype=torch.long)
            t0 = time.perf_counter()
            [gen] = self.engine.generate([ids], options)
            self.totals["seconds"] += time.perf_counter() - t0
            tokens = gen.ids[:budget] if budget else gen.ids
            text = self._codec.decode(tokens)
            text = cut_at_stops(text, (gen_kwargs or {}).get("until"))
            self.totals["requests"] += 1
            self.totals["nfe"] += gen.stats["nfe"]
            self.totals["generated_tokens"] += len(tokens)
            out.append(text)
            self.cache_hook.add_partial("generate_until", request.args, text)
        if out:
            t = self.totals
            print(
                f"blockbatch[{self.policy_spec}]: {t['requests']} requests, mean NFE {t['nfe'] / t['requests']:.2f}, "
                f"{t['seconds'] / t['requests'] * 1e3:.1f} ms per request",
                file=sys.stderr,
            )
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "blockbatch: loglikelihood is not supported: a masked diffusion model has no left-to-right "
            "likelihood; use generate_until tasks (output_type: generate_until)"
        )

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            "blockbatch: loglikelihood_rolling (perplexity) is not supported by a masked diffusion decoder; "
            "use generate_until tasks"
        )

    # -- chat templates (lm-eval --apply_chat_template) --------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return str(self.pretrained or "blockbatch-toy")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self._codec.chat_template

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        self.chat_applied = True
        return self._codec.render_chat(chat_history, add_generation_prompt)


def _spec_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "/".join(str(v) for v in value)
    return "none" if value is None else str(value)


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the ``blockbatch`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    if len(sys.argv) == 1 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)  # the blockbatch model and its model_args, then lm-eval's own help
        print("Decode options (model_args):")
        for name in SPEC_OPTIONS:
            print(f"  {name}: {contract.cli_help(contract.BY_NAME[name])}")
        print("lm-eval's command line follows.\n")
    cli_evaluate()


if __name__ == "__main__":
    main()
