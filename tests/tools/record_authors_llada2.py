"""Record the LLaDA2 authors' model and ``generate`` (LLaDA2.0 and LLaDA2.1) on small random
checkpoints into a JSON fixture, for ``tests/decode/test_llada2_reference.py``.

The authors' code is the Hugging Face remote code shipped with the LLaDA2 checkpoints; readable
copies are in ``github:ZHZisZZ/dllm``: ``dllm/pipelines/llada/models/modeling_llada2_moe.py`` at
commit 85cb53a0 (LLaDA2.0) and ``dllm/pipelines/llada21/models/modeling_llada2_moe.py`` at 5589aeb4
(LLaDA2.1). Nothing of it is copied here: this script reads the two files named on the command
line at run time and executes, from each, the definitions it needs (the RMSNorm, rotary, MLP,
gate, MoE, attention and decoder-layer classes, and the ``generate`` method with its sampling
helpers). ``transformers`` is not installed here: the few names those definitions use from it
(``ACT2FN``, the default RoPE initialisation, ``dynamic_rope_update``, a logger) get minimal
stand-ins that do what the eager float32 path needs. The model around the layers (embeddings,
final norm, LM head) is a small wrapper that runs their layers in order, as ``LLaDA2MoeModel``
does.

What is recorded is the authors' algorithm with the two defects the issue names corrected, as the
intended semantics: LLaDA2.0's sampler has no greedy branch (temperature 0 samples at
temperature 1), so LLaDA2.1's sampler (argmax, float32 confidence) is used for both; LLaDA2.1
builds its block mask without ``.log()`` (a 0/1 additive mask masks nothing), so the wrapper turns
a 0/1 mask into LLaDA2.0's 0 / -inf one. Everything else (schedule, threshold rule, editing, post
steps, EOS handling, NFE) runs as shipped. Each case also records the largest logit difference
between their model and ``blockbatch.reference.llada2`` on one canvas.

Usage (from the repository root, the package and tests/helpers importable)::

    git clone https://github.com/ZHZisZZ/dllm /tmp/dllm
    git -C /tmp/dllm show 85cb53a0:dllm/pipelines/llada/models/modeling_llada2_moe.py > /tmp/llada20.py
    git -C /tmp/dllm show 5589aeb4:dllm/pipelines/llada21/models/modeling_llada2_moe.py > /tmp/llada21.py
    PYTHONPATH=python:tests python tests/tools/record_authors_llada2.py /tmp/llada20.py /tmp/llada21.py \\
        --out tests/fixtures/authors_llada2_random.json
    PYTHONPATH=python:tests python tests/tools/record_authors_llada2.py /tmp/llada20.py /tmp/llada21.py \\
        --trained python/blockbatch/toy/checkpoint_llada2 --out tests/fixtures/authors_llada2_toy.json

``--trained DIR``: the cases run on a trained LLaDA2 checkpoint (the shipped toy) with held-out toy
prompts instead of random weights.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import math
import textwrap
import types
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from blockbatch.reference import llada2 as ref
from helpers.llada2 import tiny_config

MODULE_NAMES = (
    "LLaDA2MoeRMSNorm",
    "LLaDA2MoeRotaryEmbedding",
    "rotate_half",
    "apply_rotary_pos_emb",
    "LLaDA2MoeMLP",
    "LLaDA2MoeGate",
    "LLaDA2MoeSparseMoeBlock",
    "repeat_kv",
    "eager_attention_forward",
    "LLaDA2MoeAttention",
    "LLaDA2MoeDecoderLayer",
)
LM_METHODS = (
    "_top_k_logits",
    "_top_p_logits",
    "_sample_with_temperature_topk_topp",
    "_get_num_transfer_tokens",
    "generate",
)


def _default_rope(config, device=None):
    """transformers' default RoPE parameters (``_compute_default_rope_parameters``): partial rotary."""
    dim = int(config.head_dim * getattr(config, "partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv_freq, 1.0


class _Subscriptable:
    def __getitem__(self, item):
        return Any


def load_authors(path: str) -> tuple[dict[str, Any], type]:
    """The authors' definitions from ``path``: the module-level ones in MODULE_NAMES, and a class
    holding LLaDA2MoeModelLM's methods in LM_METHODS."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    source = open(path, encoding="utf-8").read()
    ns: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "F": F,
        "math": math,
        "Optional": Optional,
        "Tuple": Tuple,
        "Callable": Callable,
        "Any": Any,
        "Unpack": _Subscriptable(),
        "TransformersKwargs": dict,
        "Cache": object,
        "ACT2FN": {"silu": nn.SiLU()},
        "ROPE_INIT_FUNCTIONS": {"default": _default_rope},
        "dynamic_rope_update": lambda f: f,
        "ALL_ATTENTION_FUNCTIONS": {},
        "logger": logging.getLogger("authors-llada2"),
    }
    methods = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in MODULE_NAMES:
            exec(compile(ast.Module([node], []), path, "exec"), ns)
        if isinstance(node, ast.ClassDef) and node.name == "LLaDA2MoeModelLM":
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef) and m.name in LM_METHODS]
    missing = set(MODULE_NAMES) - set(ns) or set(LM_METHODS) - {m.name for m in methods}
    if missing:
        raise SystemExit(f"{path}: no definition of {sorted(missing)}")
    decorated = "".join(
        textwrap.indent(
            "".join(f"@{ast.get_source_segment(source, d)}\n" for d in m.decorator_list)
            + (ast.get_source_segment(source, m) or ""),
            "    ",
        )
        + "\n"
        for m in methods
    )
    exec(compile("class AuthorsMethods:\n" + decorated, path, "exec"), ns)
    return ns, ns["AuthorsMethods"]


def authors_config(cfg: ref.LLaDA2Config) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        **dataclasses.asdict(cfg),
        hidden_act="silu",
        attention_dropout=0.0,
        max_position_embeddings=4096,
        rope_scaling=None,
        sliding_window=None,
        _attn_implementation="eager",
    )


def authors_model(
    ns: dict[str, Any],
    methods: type,
    cfg: ref.LLaDA2Config,
    weights: dict[str, torch.Tensor],
    fix_sampler: Callable | None,
    fix_mask: bool,
):
    """Their layers in a small LLaDA2MoeModelLM stand-in, loaded with ``weights``; counts forwards.
    ``fix_sampler``: the sampler to use instead of theirs; ``fix_mask``: read the 0/1 block mask
    LLaDA2.1's generate passes as the 0 / -inf mask it means."""
    config = authors_config(cfg)

    class AuthorsLM(nn.Module, methods):  # type: ignore[misc, valid-type]
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(ns["LLaDA2MoeDecoderLayer"](config, i) for i in range(cfg.num_hidden_layers))
            self.norm = ns["LLaDA2MoeRMSNorm"](cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.rotary_emb = ns["LLaDA2MoeRotaryEmbedding"](config)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            self.forwards = 0

        @property
        def device(self):
            return torch.device("cpu")

        def forward(self, input_ids, attention_mask=None, position_ids=None, **_):
            self.forwards += 1
            if fix_mask and attention_mask is not None:
                assert bool(((attention_mask == 0) | (attention_mask == 1)).all())
                attention_mask = torch.where(attention_mask > 0, 0.0, float("-inf"))  # LLaDA2.1's mask, as meant
            h = self.word_embeddings(input_ids)
            position_embeddings = self.rotary_emb(h, position_ids)
            for layer in self.layers:
                h = layer(
                    h, attention_mask=attention_mask, position_ids=position_ids, position_embeddings=position_embeddings
                )[0]
            return types.SimpleNamespace(logits=self.lm_head(self.norm(h)))

    model = AuthorsLM().eval()
    state = {}
    for name, t in weights.items():
        if name.startswith("model.word_embeddings."):
            state["word_embeddings.weight"] = t
        elif name.startswith("model."):
            state[name[len("model.") :]] = t
        else:
            state[name] = t
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["word_embeddings.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    empty = [k for k in missing if model.state_dict()[k].numel() == 0]  # num_shared_experts 0: a 0-wide MLP
    assert not unexpected and set(missing) == set(empty), (unexpected, set(missing) - set(empty))
    if fix_sampler is not None:
        model._sample_with_temperature_topk_topp = types.MethodType(fix_sampler, model)
    return model


CASES = [
    # (name, config, seed, logit scale, prompt length, gen_length, options)
    (
        "moe-gqa-b16",
        dict(
            num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1
        ),
        1,
        6.0,
        5,
        32,
        dict(block_length=16, steps=16, threshold=0.6),
    ),
    (
        "moe-gqa-b32",
        dict(
            num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1
        ),
        2,
        6.0,
        7,
        64,
        dict(block_length=32, steps=8, threshold=0.7),
    ),
    (
        "dense-full-rotary",
        dict(num_experts=None, partial_rotary_factor=1.0),
        3,
        6.0,
        20,
        32,
        dict(block_length=16, steps=4, threshold=0.5),
    ),
    (
        "moe-one-expert-no-shared",
        dict(num_experts=4, n_group=2, topk_group=1, num_experts_per_tok=1, num_shared_experts=0),
        4,
        6.0,
        3,
        32,
        dict(block_length=16, steps=16, threshold=0.9),
    ),
    (
        "moe-eos-stop",
        dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1),
        5,
        6.0,
        4,
        48,
        dict(block_length=16, steps=8, threshold=0.4, stop_on_eos=True),
    ),
    (
        "moe-eos",
        dict(num_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2, num_shared_experts=1),
        6,
        6.0,
        4,
        48,
        dict(block_length=16, steps=8, threshold=0.4),
    ),
]
# The cases whose EOS id is a token the model predicts often (so that the EOS rules run): the most
# frequent argmax over the first block of the all-mask canvas; the others use EOS_ID.
EOS_FROM_MODEL = {"moe-eos-stop", "moe-eos"}
EOS_ID, MASK_ID = 62, 63
EDIT_OPTIONS = [dict(edit_threshold=0.5, threshold=0.7, max_post_steps=3), dict(edit_threshold=0.9, max_post_steps=16)]


def cases(trained: str | None):
    """(name, config, weights, seed, logit scale, prompt, gen_length, options, eos id, mask id) per
    case: the random ones of CASES, or held-out toy prompts on a trained checkpoint."""
    if trained is None:
        for name, over, seed, scale, prompt_len, gen_length, options in CASES:
            cfg = tiny_config(**over)
            prompt = torch.randint(0, 60, (prompt_len,), generator=torch.Generator().manual_seed(seed))
            yield (
                name,
                cfg,
                ref.random_weights(cfg, seed, logit_scale=scale),
                seed,
                scale,
                prompt,
                gen_length,
                options,
                (EOS_ID),
                MASK_ID,
            )
        return
    from blockbatch.families import llada2 as fam
    from blockbatch.loading import load_checkpoint
    from blockbatch.toy import task as toy_task
    from blockbatch.toy import tokenizer as toy_tok

    ckpt = load_checkpoint(trained)
    cfg = fam.reference_config(ckpt.config)
    weights = {k: v.float() for k, v in ckpt.weights.items()}
    problems = toy_task.make_problems(3, seed=4242, split="test")
    tok = toy_tok.build_tokenizer()
    settings = [
        dict(block_length=32, steps=32, threshold=0.95),
        dict(block_length=16, steps=8, threshold=0.9, stop_on_eos=True),
    ]
    for i, p in enumerate(problems):
        prompt = torch.tensor(toy_tok.encode(tok, p.prompt))
        options = settings[i % len(settings)]
        yield (
            f"toy-{i}-b{options['block_length']}",
            cfg,
            weights,
            None,
            None,
            prompt,
            64,
            options,
            (ckpt.config.eos_token_id),
            ckpt.config.mask_token_id,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llada20", help="modeling_llada2_moe.py of LLaDA2.0 (dllm 85cb53a0)")
    ap.add_argument("llada21", help="modeling_llada2_moe.py of LLaDA2.1 (dllm 5589aeb4)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--trained", default=None, help="a trained LLaDA2 checkpoint folder (the toy) instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ns20, methods20 = load_authors(args.llada20)
    ns21, methods21 = load_authors(args.llada21)
    greedy = methods21._sample_with_temperature_topk_topp
    mask_id = MASK_ID
    records = []
    for name, cfg, weights, seed, scale, prompt, gen_length, options, eos_id, mask_id in cases(args.trained):
        prompt_len = prompt.numel()
        ours = ref.LLaDA2Reference(cfg, weights)
        if name in EOS_FROM_MODEL:
            canvas = torch.cat([prompt, torch.full((gen_length,), mask_id)])
            eos_id = int(ours.forward(canvas, options["block_length"])[prompt_len:].argmax(-1).mode().values)
        for version, (ns, methods), extra_list in (
            ("2.0", (ns20, methods20), [{}]),
            ("2.1", (ns21, methods21), EDIT_OPTIONS),
        ):
            for extra in extra_list:
                opts = {**options, **extra}
                model = authors_model(
                    ns, methods, cfg, weights, greedy if version == "2.0" else None, fix_mask=version == "2.1"
                )
                canvas = torch.randint(
                    0, cfg.vocab_size, (2 * opts["block_length"],), generator=torch.Generator().manual_seed(7)
                )
                block_mask = (
                    torch.tril(torch.ones(2, 2))
                    .repeat_interleave(opts["block_length"], 0)
                    .repeat_interleave(opts["block_length"], 1)[None, None]
                )
                if version == "2.0":
                    block_mask = block_mask.log()
                with torch.no_grad():
                    theirs = model(
                        canvas[None], attention_mask=block_mask, position_ids=torch.arange(canvas.numel())[None]
                    ).logits[0]
                logit_diff = float((theirs - ours.forward(canvas, opts["block_length"])).abs().max())
                model.forwards = 0
                call = dict(
                    temperature=0.0,
                    block_length=opts["block_length"],
                    steps=opts["steps"],
                    gen_length=gen_length,
                    eos_early_stop=opts.get("stop_on_eos", False),
                    threshold=opts["threshold"],
                    eos_id=eos_id,
                    mask_id=mask_id,
                )
                if version == "2.1":
                    call.update(editing_threshold=opts["edit_threshold"], max_post_steps=opts["max_post_steps"])
                out = model.generate(prompt[None], **call)
                ids = out[0].tolist()
                early = (
                    version == "2.0"
                    and bool(opts.get("stop_on_eos"))
                    and ids[:prompt_len] == prompt.tolist()
                    and ids[-1:] == [eos_id]
                )
                if early:  # LLaDA2.0's EOS early return includes the prompt; its normal return does not
                    ids = ids[prompt_len:]
                records.append(
                    {
                        "name": f"{name}/{version}{'/' + str(extra) if extra else ''}",
                        "version": version,
                        "config": dataclasses.asdict(cfg),
                        **({"checkpoint": "toy"} if args.trained else {}),
                        "seed": seed,
                        "logit_scale": scale,
                        "prompt": prompt.tolist(),
                        "gen_length": gen_length,
                        "options": opts,
                        "eos_id": eos_id,
                        "mask_id": mask_id,
                        "generated": ids,
                        "early_return": early,
                        "nfe": model.forwards,
                        "max_logit_diff": logit_diff,
                    }
                )
                print(f"{records[-1]['name']}: {len(ids)} tokens, nfe {model.forwards}, logits diff {logit_diff:.2e}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(
            {
                "source": "github.com/ZHZisZZ/dllm 85cb53a0 (LLaDA2.0), 5589aeb4 (LLaDA2.1)",
                "recorder": "tests/tools/record_authors_llada2.py",
                "cases": records,
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
