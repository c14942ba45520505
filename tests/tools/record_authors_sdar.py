"""Record the SDAR authors' model and decoder on an SDAR checkpoint (the shipped toy) into a JSON fixture,
for ``tests/decode/test_sdar_authors.py``.

The authors' code is github.com/JetAstra/SDAR: ``training/model/SDAR-8B-Chat/modeling_sdar.py`` (the
model), ``generate.py`` (``block_diffusion_generate`` with the four remasking strategies) and
``evaluation/opencompass/opencompass/models/huggingface_bd3.py`` (their harness's
``sample_with_temperature_topk_topp``, whose confidence is the unfiltered softmax probability). Nothing of
it is copied here: this script reads the three files named on the command line at run time and executes,
from each, the definitions it needs. ``transformers``, ``flash_attn``, ``einops`` and ``liger_kernel`` are
not installed here: the few names those definitions use get minimal stand-ins that do what the eager
float32 CPU path needs (``flash_attn_func``: attention without a mask over GQA heads; ``flash_rms_norm``:
RMSNorm in float32; ``DynamicCache``: per-layer K/V concatenation; the default RoPE initialisation). The
model around the layers (embeddings, rotary embedding, final norm, LM head) is a small wrapper that runs
their layers as ``SDARModel.forward`` does, counting its forwards by kind.

What is recorded is ``block_diffusion_generate`` as shipped, greedy through the harness's sampler
(temperature 1, top_k 1: the argmax and its unfiltered probability), with one repair: its
``entropy_bounded`` branch never creates ``transfer_index`` (a NameError on a block's first step), so the
recorder inserts the zero mask the other branches start from. Each case also records the largest logit
difference between their model and ``blockbatch.reference.sdar`` on one block-causal canvas.

Usage (from the repository root, the package importable)::

    git clone https://github.com/JetAstra/SDAR /tmp/SDAR
    PYTHONPATH=python:tests python tests/tools/record_authors_sdar.py \\
        /tmp/SDAR/training/model/SDAR-8B-Chat/modeling_sdar.py /tmp/SDAR/generate.py \\
        /tmp/SDAR/evaluation/opencompass/opencompass/models/huggingface_bd3.py \\
        --checkpoint python/blockbatch/toy/checkpoint_sdar --out tests/fixtures/authors_sdar_toy.json
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import types
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

MODEL_NAMES = (
    "SDARRMSNorm",
    "SDARMLP",
    "rotate_half",
    "apply_rotary_pos_emb",
    "repeat_kv",
    "SDARAttention",
    "SDARDecoderLayer",
    "SDARRotaryEmbedding",
)
GENERATE_NAMES = ("get_num_transfer_tokens", "block_diffusion_generate")
HARNESS_NAMES = ("top_k_logits", "top_p_logits", "sample_with_temperature_topk_topp")
STRATEGIES = {  # ours -> theirs
    "dynamic": "low_confidence_dynamic",
    "static": "low_confidence_static",
    "sequential": "sequential",
    "entropy_bounded": "entropy_bounded",
}


class _Subscriptable:
    def __getitem__(self, item):
        return Any


def _flash_rms_norm(x, weight, bias=None, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _flash_attn_func(q, k, v, causal=False, softmax_scale=None):
    """flash_attn's layout ``[b, l, heads, d]``, GQA by head groups, no mask."""
    assert not causal
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, scale=softmax_scale, enable_gqa=True)
    return out.transpose(1, 2)


def _rearrange(x, pattern: str):
    assert pattern in ("b h l d -> b l (h d)", "b l h d -> b l (h d)"), pattern
    if pattern.startswith("b h l d"):
        x = x.transpose(1, 2)
    return x.reshape(x.shape[0], x.shape[1], -1)


def _default_rope(config, device=None):
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv_freq, 1.0


class _Cache:
    """transformers' DynamicCache as the authors' attention uses it: update, [layer], len."""

    def __init__(self):
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []

    def update(self, k, v, layer_idx):
        if layer_idx == len(self.layers):
            self.layers.append((k, v))
        else:
            old_k, old_v = self.layers[layer_idx]
            self.layers[layer_idx] = (torch.cat([old_k, k], dim=-2), torch.cat([old_v, v], dim=-2))
        return self.layers[layer_idx]

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def get_seq_length(self):
        return self.layers[0][0].shape[-2] if self.layers else 0


def _defs(path: str, names: tuple[str, ...], ns: dict, patch: tuple[str, str] | None = None) -> None:
    source = open(path, encoding="utf-8").read()
    if patch is not None:
        assert patch[0] in source, f"{path}: the text to repair is not there"
        source = source.replace(patch[0], patch[1])
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            exec(compile(ast.Module([node], []), path, "exec"), ns)
    missing = set(names) - set(ns)
    if missing:
        raise SystemExit(f"{path}: no definition of {sorted(missing)}")


def load_authors(modeling: str, generate: str, harness: str) -> dict[str, Any]:
    ns: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "F": F,
        "Optional": Optional,
        "Tuple": Tuple,
        "Unpack": _Subscriptable(),
        "FlashAttentionKwargs": dict,
        "Cache": object,
        "SDARConfig": object,
        "GradientCheckpointingLayer": nn.Module,
        "ACT2FN": {"silu": nn.SiLU()},
        "ROPE_INIT_FUNCTIONS": {"default": _default_rope},
        "dynamic_rope_update": lambda f: f,
        "use_kernel_forward_from_hub": lambda name: lambda cls: cls,
        "flash_rms_norm": _flash_rms_norm,
        "flash_attn_func": _flash_attn_func,
        "rearrange": _rearrange,
        "liger_kernel_is_available": False,
        "logger": logging.getLogger("authors-sdar"),
        "DynamicCache": _Cache,
        "np": __import__("numpy"),
    }
    _defs(modeling, MODEL_NAMES, ns)
    gen_ns = dict(ns)
    repair = (
        'elif remasking_strategy == "entropy_bounded":\n',
        'elif remasking_strategy == "entropy_bounded":\n'
        "                transfer_index = torch.zeros_like(x0, dtype=torch.bool)\n",
    )
    _defs(generate, GENERATE_NAMES, gen_ns, patch=repair)
    _defs(harness, HARNESS_NAMES, gen_ns)
    # generate.py's block_diffusion_generate calls the sampler of its namespace: the harness's (greedy).
    ns["generate"] = gen_ns["block_diffusion_generate"]
    return ns


class AuthorsModel(nn.Module):
    """SDARForCausalLM around the authors' layers (SDARModel.forward's loop), counting forwards."""

    def __init__(self, ns: dict, config: types.SimpleNamespace, weights: dict[str, torch.Tensor]):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([ns["SDARDecoderLayer"](config, i) for i in range(config.num_hidden_layers)])
        self.norm = ns["SDARRMSNorm"](config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = ns["SDARRotaryEmbedding"](config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        state = {k.removeprefix("model."): v.float() for k, v in weights.items()}
        self.load_state_dict(state, strict=True)
        self.eval()
        self.kinds = {"prefill": 0, "denoise": 0, "store": 0}
        self.started = False

    @property
    def device(self):
        return self.lm_head.weight.device

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                store_kv=False):  # fmt: skip
        if store_kv:
            self.kinds["store" if self.started else "prefill"] += 1
        else:
            self.kinds["denoise"] += 1
            self.started = True
        h = self.embed_tokens(input_ids)
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        cache_position = torch.arange(past, past + h.shape[1])
        emb = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(
                h,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_value=past_key_values,
                use_cache=use_cache,
                store_kv=store_kv,
                cache_position=cache_position,
                position_embeddings=emb,
            )[0]
        return types.SimpleNamespace(logits=self.lm_head(self.norm(h)))


def authors_config(raw: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        **{
            **raw,
            "attention_dropout": 0.0,
            "sliding_window": None,
            "use_sliding_window": False,
            "max_window_layers": raw["num_hidden_layers"],
            "_attn_implementation": "sdpa",
        }
    )


CASE_OPTIONS = [
    dict(block_length=4, steps=None, unmasking="dynamic", threshold=0.85),
    dict(block_length=4, steps=None, unmasking="dynamic", threshold=0.5),
    dict(block_length=4, steps=2, unmasking="dynamic", threshold=0.9),
    dict(block_length=8, steps=None, unmasking="dynamic", threshold=0.85),
    dict(block_length=8, steps=4, unmasking="dynamic", threshold=0.7),
    dict(block_length=4, steps=None, unmasking="static"),
    dict(block_length=8, steps=4, unmasking="static"),
    dict(block_length=16, steps=None, unmasking="static"),
    dict(block_length=4, steps=None, unmasking="sequential"),
    dict(block_length=8, steps=3, unmasking="sequential"),
    dict(block_length=4, steps=None, unmasking="entropy_bounded", entropy_bound=0.35),
    dict(block_length=8, steps=None, unmasking="entropy_bounded", entropy_bound=1.0),
    dict(block_length=16, steps=None, unmasking="entropy_bounded", entropy_bound=0.1),
]


def main() -> None:
    from blockbatch.loading import load_checkpoint
    from blockbatch.families import sdar as fam
    from blockbatch.reference import sdar as ref
    from blockbatch.toy import task as toy_task
    from blockbatch.toy import tokenizer as toy_tok

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modeling")
    ap.add_argument("generate")
    ap.add_argument("harness")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--gen-length", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ns = load_authors(args.modeling, args.generate, args.harness)
    ckpt = load_checkpoint(args.checkpoint)
    config = ckpt.config
    raw = fam.write_config(config)
    weights = {k: v.float() for k, v in ckpt.weights.items()}
    ours = ref.SDARReference(fam.reference_config(config), weights)
    tokenizer = toy_tok.build_tokenizer()
    problems = toy_task.make_problems(args.prompts, seed=77, split="test")
    records = []
    for i, problem in enumerate(problems):
        prompt = torch.tensor(toy_tok.encode(tokenizer, problem.prompt))
        for options in CASE_OPTIONS:
            B = options["block_length"]
            model = AuthorsModel(ns, authors_config(raw), weights)
            canvas = torch.cat([prompt, torch.full((B,), config.mask_token_id)])
            n = (canvas.numel() // B) * B
            visible = (torch.arange(n) // B)[None, :] <= (torch.arange(n) // B)[:, None]
            with torch.no_grad():
                theirs = model(canvas[None, :n], attention_mask=visible[None].float(),
                               position_ids=torch.arange(n)[None], past_key_values=None).logits[0]  # fmt: skip
            diff = float((theirs - ours.forward(canvas[:n], B)).abs().max())
            model.kinds, model.started = {"prefill": 0, "denoise": 0, "store": 0}, False
            out = ns["generate"](
                model,
                {"input_ids": prompt[None]},
                config.mask_token_id,
                gen_length=args.gen_length,
                block_length=B,
                denoising_steps=options["steps"] or B,
                temperature=1.0,
                top_k=1,
                top_p=1.0,
                remasking_strategy=STRATEGIES[options["unmasking"]],
                confidence_threshold=options.get("threshold", 0.85),
                eb_threshold=options.get("entropy_bound"),
                stopping_criteria_idx=[config.eos_token_id],
            )
            ids = out[0, : prompt.numel() + args.gen_length].tolist()
            kinds = dict(model.kinds)
            name = f"toy{i}/" + ",".join(f"{k}={v}" for k, v in options.items() if v is not None)
            records.append(
                {
                    "name": name,
                    "prompt": prompt.tolist(),
                    "gen_length": args.gen_length,
                    "options": options,
                    "canvas": ids,
                    "nfe": sum(kinds.values()),
                    "nfe_kinds": kinds,
                    "max_logit_diff": diff,
                }
            )
            print(f"{name}: nfe {records[-1]['nfe']} {kinds}, logits diff {diff:.2e}")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(
            {
                "source": "github.com/JetAstra/SDAR c2041a8 (modeling_sdar.py of SDAR-8B-Chat, generate.py, "
                "the opencompass harness's sampler)",
                "recorder": "tests/tools/record_authors_sdar.py",
                "checkpoint": "toy",
                "cases": records,
            },
            f,
            indent=1,
        )
        f.write("\n")


if __name__ == "__main__":
    main()
