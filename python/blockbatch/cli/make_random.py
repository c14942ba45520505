"""``blockbatch make-random``: a checkpoint with random weights in the exact Hugging Face layout of
its family (for trying loading, the forward and the decoders at a shape; it answers nothing)."""

from __future__ import annotations

import argparse
import math
import os

from .. import families
from ..engine import DTYPES
from ..random_tokenizer import CHAT_TEMPLATE
from .common import UsageError


_SHAPE_FLAGS = {
    "d_model": "d_model",
    "layers": "n_layers",
    "heads": "n_heads",
    "kv_heads": "n_kv_heads",
    "mlp": "mlp_hidden_size",
    "vocab": "vocab_size",
}
_SHAPE_DEFAULTS = {"d_model": 128, "layers": 2, "heads": 4, "mlp": 256, "vocab": 256}
BPE_DEFAULT_VOCAB = 1024  # --vocab with --tokenizer bpe (the 256 bytes, 759 merges, 9 markup / special tokens)
PRESETS = {preset: family for preset, (family, _) in families.published_shapes().items()}  # preset -> family
_SHARD_BYTES = 5 * 10**9  # presets are written in shards of at most 5 GB, as save_pretrained does
# At most this many tensors (LLaDA2-flash, 100B parameters, has about 25k; each is listed before it is made).
MAX_TENSORS = 1 << 20


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _make_random_shape(args: argparse.Namespace, family: str) -> dict:
    """ModelConfig fields of the shape make-random writes (the preset's, or the flags' with defaults)."""
    given = [name for name in (*_SHAPE_FLAGS, "experts") if getattr(args, name) is not None]
    if args.preset is not None:
        if given:
            raise UsageError(
                f"--preset {args.preset} fixes the shape; drop "
                f"{' / '.join(_flag(n) for n in given)} (or drop --preset to choose the shape)"
            )
        return dict(families.published_shapes()[args.preset][1])
    shape = {
        _SHAPE_FLAGS[n]: getattr(args, n) if getattr(args, n) is not None else _SHAPE_DEFAULTS[n]
        for n in _SHAPE_FLAGS
        if n != "kv_heads"
    }
    if args.experts is not None:
        if not families.get(family).MIXTURE_OF_EXPERTS:
            moe = ", ".join(n for n, m in families.REGISTRY.items() if m.MIXTURE_OF_EXPERTS)
            raise UsageError(f"--experts is a {moe} flag (mixture-of-experts layers); {family} models are dense")
        shape["num_experts"] = args.experts
    heads = shape["n_heads"]
    if args.kv_heads is not None:
        shape["n_kv_heads"] = args.kv_heads
    else:  # the family's default (LLaDA: no GQA; Dream: half as many KV heads, as Dream has)
        shape["n_kv_heads"] = families.get(family).default_kv_heads(heads)
    return shape


def run(args: argparse.Namespace) -> int:
    from ..config import ModelConfig
    from ..loading import (
        CONFIG_NAME,
        INDEX_NAME,
        TOKENIZER_CONFIG_NAME,
        TOKENIZER_NAME,
        WEIGHTS_NAME,
        expected_weight_shapes,
    )

    family = args.family
    if args.preset is not None:
        if family is not None and family != PRESETS[args.preset]:
            raise UsageError(
                f"--preset {args.preset} is a {PRESETS[args.preset]} shape, but --family is {family}; "
                f"drop --family or pass --family {PRESETS[args.preset]}"
            )
        family = PRESETS[args.preset]
    family = family or next(iter(families.REGISTRY))  # the default family (the options table's first)
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"{args.out}: exists and is not a directory; make-random writes a checkpoint folder")
    from ..toy import SHIPPED_CHECKPOINT_DIRS

    for (
        toy_family,
        toy,
    ) in SHIPPED_CHECKPOINT_DIRS.items():  # part of the installed package: never replaced, --force or not
        if os.path.isdir(args.out) and os.path.samefile(args.out, toy):
            raise UsageError(
                f"{args.out}: is the {toy_family} toy checkpoint shipped in the package (the default model); "
                f"write the random checkpoint to another folder"
            )
    present = [
        n
        for n in (CONFIG_NAME, WEIGHTS_NAME, INDEX_NAME, TOKENIZER_NAME, TOKENIZER_CONFIG_NAME)
        if os.path.lexists(os.path.join(args.out, n))
    ]
    if present and not args.force:
        raise UsageError(f"{args.out}: already holds {', '.join(present)}; pass --force to overwrite that checkpoint")
    if args.tokenizer == "bpe" and args.preset is None and args.vocab is None:
        args.vocab = BPE_DEFAULT_VOCAB
    shape = _make_random_shape(args, family)
    from ..random_checkpoint import make_random_checkpoint, random_config

    tokenizer = None
    if args.tokenizer == "bpe":
        from ..random_tokenizer import MAX_VOCAB, MIN_VOCAB, build_bpe_tokenizer

        vocab = shape["vocab_size"]
        if not MIN_VOCAB <= vocab <= MAX_VOCAB:
            raise UsageError(
                f"--tokenizer bpe makes a tokenizer of --vocab ids, which must be in [{MIN_VOCAB}, {MAX_VOCAB}] "
                f"(the 256 bytes, the markup and special tokens, merges), got {vocab}"
            )
        tokenizer = build_bpe_tokenizer(vocab, seed=args.seed)
        # the tokenizer's EOS and mask are its last two ids, as a random config's are; said explicitly so
        # that every family's config names them
        shape["eos_token_id"], shape["mask_token_id"] = vocab - 2, vocab - 1

    if not math.isfinite(args.logit_scale):
        raise UsageError(f"--logit-scale must be a finite number, got {args.logit_scale}")
    config: ModelConfig = random_config(family, **shape)  # CheckpointError naming a bad size

    # Bounded before anything is listed or allocated: the tensor count costs nothing to compute, the
    # list of shapes is as long as it (--experts 65536 --layers 100 would list 19.7M tensors).
    tensors = families.tensor_count(config)
    if tensors > MAX_TENSORS:
        raise UsageError(
            f"this shape has {tensors} tensors, more than the {MAX_TENSORS} make-random writes: pass fewer --layers"
            + (" / --experts" if config.num_experts else "")
        )
    dtype = DTYPES[args.dtype]
    params = sum(math.prod(s) for s in expected_weight_shapes(config).values())
    nbytes = params * dtype.itemsize
    memory = _physical_memory()
    if memory and 2 * nbytes > memory:
        what = (
            f"a {family} checkpoint of shape {args.preset} ({params / 1e9:.2f}B parameters) in {args.dtype}"
            if args.preset
            else f"a {family} checkpoint of this shape in {args.dtype}"
        )
        if args.preset:
            fix = (
                f"run it on a machine with at least {2 * nbytes / 2**30:.0f} GiB"
                + (", or pass --dtype bfloat16 to halve it" if dtype.itemsize > 2 else "")
                + f", or drop --preset {args.preset} and choose a small shape with --d-model / --layers / --mlp "
                "/ --vocab"
            )
        else:
            fix = "pass smaller --d-model / --layers / --mlp / --vocab" + (
                " or --dtype bfloat16" if dtype.itemsize > 2 else ""
            )
        raise UsageError(
            f"{what} is {nbytes / 2**30:.1f} GiB, too large to build in this machine's "
            f"{memory / 2**30:.1f} GiB of memory (writing it takes about twice its size): {fix}"
        )
    config = make_random_checkpoint(
        args.out,
        family=family,
        seed=args.seed,
        dtype=dtype,
        logit_scale=args.logit_scale,
        max_shard_bytes=_SHARD_BYTES if args.preset and nbytes > _SHARD_BYTES else None,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE if tokenizer is not None else None,
        **shape,
    )
    name = families.get(family).DISPLAY_NAME
    print(
        f"wrote a random {name} checkpoint{f' (preset {args.preset})' if args.preset else ''} to {args.out}: "
        f"d_model={config.d_model}, layers={config.n_layers}, heads={config.n_heads}/{config.n_kv_heads} (q/kv), "
        f"mlp={config.mlp_hidden_size}, vocab={config.vocab_size}, {params / 1e6:.2f}M parameters in {args.dtype} "
        f"({nbytes / 2**20:.1f} MiB); mask id {config.mask_token_id}, eos id {config.eos_token_id}"
        + ("; byte-level BPE tokenizer and a chat template with tools" if tokenizer is not None else "")
    )
    return 0


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "make-random",
        help="write a random LLaDA, Dream, LLaDA2 or SDAR checkpoint folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write a checkpoint with random weights in the exact Hugging Face layout of its family: LLaDA\n"
        "(model.transformer.*, config.json) or Dream (Qwen2 names with q/k/v biases, config.json with\n"
        'model_type "Dream", generation_config.json) or LLaDA2 (model_type "llada2_moe": fused\n'
        'query_key_value, QK-norm, mixtures of experts after the first layer) or SDAR (model_type "sdar": a dense\n'
        "Qwen3 body, split q/k/v/o, QK-norm, block-causal). The weights are random: such a\n"
        "checkpoint\n"
        "exercises loading, the forward and the decoders at a given shape, never answers anything.\n"
        "The shipped trained toys are python/blockbatch/toy/checkpoint{,_dream}.",
        epilog="examples:\n"
        "  blockbatch make-random /tmp/llada                       (LLaDA, d_model 128, 2 layers, vocab 256)\n"
        "  blockbatch make-random /tmp/dream --family dream        (Dream, same shape, 4 query / 2 KV heads)\n"
        "  blockbatch make-random /tmp/dream --family dream --layers 4 --kv-heads 1\n"
        "  blockbatch make-random /tmp/llada2 --family llada2      (LLaDA2: 4/2 heads, 8 experts top-2 + 1 shared)\n"
        "  blockbatch make-random /tmp/llada2 --family llada2 --experts 16\n"
        "  blockbatch make-random /tmp/sdar --family sdar          (SDAR: 4/2 heads of 16 dims, QK-norm)\n"
        "  blockbatch make-random /tmp/dream7b --preset dream-7b --dtype bfloat16\n"
        "        (the real Dream-v0-7B shape: 7.6B parameters, about 15 GB in bfloat16, written in 5 GB\n"
        "         shards; refused when the machine has less than about twice that in memory)\n"
        "  blockbatch make-random /tmp/bpe --tokenizer bpe         (LLaDA with a byte-level BPE tokenizer of 1024\n"
        "        ids and an LLaDA2-style chat template that renders tools: it can spell JSON and tool calls)\n"
        "then e.g.: blockbatch forward --model /tmp/dream",
    )
    p.add_argument("out", help="folder to create (or an empty / new one)")
    p.add_argument(
        "--family",
        choices=list(families.REGISTRY),
        default=None,
        help="model family and checkpoint layout (default llada; dream with --preset dream-7b, llada2 with "
        "--preset llada2-mini, sdar with --preset sdar-1.7b / sdar-8b)",
    )
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="a published shape instead of the shape flags: dream-7b = Dream-v0-7B (d_model 3584, "
        "28 layers, 28/4 heads, mlp 18944, vocab 152064); llada2-mini = LLaDA2.0-mini / 2.1-mini (16.3B "
        "parameters: 20 layers, 256 experts top-8 + 1 shared); sdar-1.7b / sdar-8b = SDAR-1.7B / 8B-Chat; use "
        "--dtype bfloat16",
    )
    p.add_argument("--force", action="store_true", help="overwrite a checkpoint already in the folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="weight dtype (default float32)")
    shape = p.add_argument_group("shape (without --preset)")
    shape.add_argument("--d-model", type=int, default=None, help=f"hidden size (default {_SHAPE_DEFAULTS['d_model']})")
    shape.add_argument("--layers", type=int, default=None, help=f"default {_SHAPE_DEFAULTS['layers']}")
    shape.add_argument("--heads", type=int, default=None, help=f"query heads (default {_SHAPE_DEFAULTS['heads']})")
    shape.add_argument(
        "--kv-heads",
        type=int,
        default=None,
        help="key/value heads, must divide --heads (default: --heads for llada, no GQA; half of --heads for dream; "
        "a quarter for llada2)",
    )
    shape.add_argument("--mlp", type=int, default=None, help=f"MLP hidden size (default {_SHAPE_DEFAULTS['mlp']})")
    shape.add_argument(
        "--vocab",
        type=int,
        default=None,
        help=f"vocabulary size; the last id is the mask, the one before EOS (default {_SHAPE_DEFAULTS['vocab']})",
    )
    shape.add_argument(
        "--experts",
        type=int,
        default=None,
        help="llada2: routed experts of the MoE layers (default 8; 0: every layer dense, written as num_experts "
        f"null); at most {MAX_TENSORS} tensors in all",
    )
    p.add_argument(
        "--tokenizer",
        choices=("none", "bpe"),
        default="none",
        help="none: weights only (pass token ids); bpe: also write a byte-level BPE tokenizer.json of --vocab ids "
        f"(default {BPE_DEFAULT_VOCAB} with bpe; merges trained on generated JSON and English-like text, EOS and "
        "mask its last two ids) and a tokenizer_config.json whose chat template, in LLaDA2's markup, renders "
        "tools and writes calls as <tool_call>{json}</tool_call>",
    )
    p.add_argument(
        "--logit-scale", type=float, default=1.0, help="LM-head scale, a finite number (sharper softmax when larger)"
    )
    p.set_defaults(func=run)
