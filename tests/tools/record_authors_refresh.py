"""Record the BlockBatch authors' LLaDA decoder on the shipped toy model into a JSON fixture.

The authors' code (github.com/Laurence-Wu/BlockBatch, ``llada/generate_blockBatching_original_bulk.py``)
is not a dependency of this project and none of it is copied here: this script takes the path of
that file on the command line and imports it at run time. Its helper module ``generate.py`` (for
``get_transfer_index``) is read from the same folder. ``tests/decode/test_authors_refresh_parity.py``
then compares the engine and the Python reference against the recorded outputs.

How the authors' function is run:

* Their model is a Hugging Face LLaDA with Fast-dLLM's dual-cache interface. ``AuthorsModel``
  below provides that interface on top of our float32 reference model
  (``blockbatch.reference.model``) on the CPU: a call without ``past_key_values`` is a full
  forward returning per-layer ``(K, V)`` of shape ``[batch, kv_heads, L, head_dim]``; a call with
  them is a dual-cache block step that reads each row's query positions from the module global
  ``_FUSED_POSITION_IDS`` (set by their block step), writes the block's K/V into the given cache
  tensors in place (``replace_position``) and attends over all ``L`` keys. The per-row arithmetic
  is the reference model's, so the logits are bit-identical to the ones our reference decoder
  sees: any difference in the recorded results comes from the decoding policy.
* Their two bfloat16 casts are removed: the EOS-probability softmax cast in
  ``_check_eos_in_block`` is edited out of the source text before it is compiled (the line
  numbers stay the same), and the flash-attention cast sits in their monkey-patched LLaDA block,
  which this adapter never calls.
* Modules their files import but that the decoding path does not use (``transformers``,
  ``model.modeling_llada``) are replaced by empty stand-ins.

Usage (from the repository root, with the package importable)::

    git clone https://github.com/Laurence-Wu/BlockBatch /tmp/BlockBatch   # recorded at 14c3c2e
    PYTHONPATH=python python tests/tools/record_authors_refresh.py \\
        /tmp/BlockBatch/llada/generate_blockBatching_original_bulk.py \\
        --out tests/fixtures/authors_refresh_toy.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import types

import torch

from blockbatch.loading import load_checkpoint
from blockbatch.reference.model import ReferenceModel
from blockbatch.tokenization import TextCodec
from blockbatch.toy import checkpoint_path, task

# The settings of issue 23: the periodic refresh fires every block or so.
SETTINGS = dict(block_sizes=[4, 16, 32, 64], threshold=0.9, conf_threshold=0.7, sync_threshold=4, gen_length=64)
REFRESH_TOKENS = (8, 4, 16)
PROBLEM_SEED = 23

EOS_CAST = "F.softmax(block_logits.to(torch.bfloat16), dim=-1)"
EOS_CAST_REMOVED = "F.softmax(block_logits, dim=-1)"


def _stub_modules() -> None:
    """Empty stand-ins for the imports the decoding path never uses."""
    if "transformers" not in sys.modules:
        tf = types.ModuleType("transformers")
        tf.AutoTokenizer = tf.AutoModel = object
        sys.modules["transformers"] = tf
    if "model.modeling_llada" not in sys.modules:
        pkg = types.ModuleType("model")
        pkg.__path__ = []
        mod = types.ModuleType("model.modeling_llada")

        class _Patched:  # their patches save and replace these attributes
            def forward(self, *a, **k):
                raise RuntimeError("the LLaDA model stand-in is never run")

            _scaled_dot_product_attention = forward

        mod.LLaDAModelLM = mod.RotaryEmbedding = mod.LLaDABlock = mod.LLaDALlamaBlock = _Patched
        pkg.modeling_llada = mod
        sys.modules["model"] = pkg
        sys.modules["model.modeling_llada"] = mod


def load_authors(path: str) -> types.ModuleType:
    """Import the authors' file with the EOS softmax in the logits' own dtype (float32 here)."""
    _stub_modules()
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # their `from generate import get_transfer_index`
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if source.count(EOS_CAST) != 1:
        raise SystemExit(f"{path}: expected one occurrence of {EOS_CAST!r}; is this the right file?")
    source = source.replace(EOS_CAST, EOS_CAST_REMOVED)
    module = types.ModuleType("authors_blockbatch_llada")
    module.__file__ = path
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 (their file, run as their module)
    module._PROFILE_LAYERS = False  # CUDA-event timing of their patched block (not run here)
    return module


class AuthorsModel:
    """The Hugging Face LLaDA call interface the authors' decoder uses, on our reference model."""

    def __init__(self, ref: ReferenceModel, module: types.ModuleType):
        self.ref = ref
        self.module = module
        self.config = types.SimpleNamespace(eos_token_id=ref.config.eos_token_id)

    def __call__(self, x, past_key_values=None, use_cache=False, replace_position=None, output_hidden_states=False):
        B, T = x.shape
        n_layers = self.ref.config.n_layers
        if past_key_values is None:  # full forward over whole canvases (init, refresh)
            kv = self.ref.new_kv(B, T)
            logits = self.ref.forward([x[b] for b in range(B)], [torch.arange(T)] * B, kv, "full")
            cache = [(kv[:, layer, 0].clone(), kv[:, layer, 1].clone()) for layer in range(n_layers)]
            return types.SimpleNamespace(logits=torch.stack(logits), past_key_values=cache)
        # dual-cache block step: each row's window attends to its own full KV row
        positions = self.module._FUSED_POSITION_IDS
        L = past_key_values[0][0].shape[2]
        kv = torch.stack([torch.stack([k, v], 1) for k, v in past_key_values], 1)  # [B, layers, 2, H, L, hd]
        logits = torch.zeros(B, T, self.ref.config.vocab_size)
        for b in range(B):
            rows = replace_position[b].nonzero()[:, 0]
            n = rows.numel()
            assert torch.equal(rows, positions[b, :n]), "replace_position and position ids disagree"
            [out] = self.ref.forward([x[b, :n]], [positions[b, :n]], kv, "dual", kv_rows=[b])
            logits[b, :n] = out
        for layer, (k, v) in enumerate(past_key_values):  # their cache is updated in place
            k.copy_(kv[:, layer, 0])
            v.copy_(kv[:, layer, 1])
        assert L == kv.shape[4]
        return types.SimpleNamespace(logits=logits, past_key_values=past_key_values)


def problems(n: int) -> list:
    return task.make_problems(n, PROBLEM_SEED, "test")


def encode_all(n: int) -> list[list[int]]:
    ckpt = load_checkpoint(checkpoint_path())
    codec = TextCodec(ckpt.tokenizer, ckpt.config, ckpt.chat_template)
    return [codec.encode(p.prompt, chat=False) for p in problems(n)]


DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # token ids as one base-36 digit each (toy vocab: 21)


def pack(ids) -> str:
    return "".join(DIGITS[int(i)] for i in ids)


def unpack(text: str) -> list[int]:
    return [DIGITS.index(c) for c in text]


RUN_FIELDS = (
    "tokens",
    "nfe",
    "nfe_winner",
    "forwards",
    "winner_block_size",
    "early_exit",
    "decoded",
    "merged",
    "copied",
    "branch_forwards",
)


def run_one(module, model: AuthorsModel, prompt: list[int], refresh: int) -> dict:
    """One decode; the authors' NFE counts the forwards the winning branch took part in."""
    s = SETTINGS
    x, nfe, stats = module.run_fused_block_batching_v2(
        model,
        torch.tensor([prompt]),
        s["gen_length"],
        list(s["block_sizes"]),
        temperature=0.0,
        mask_id=model.ref.config.mask_token_id,
        threshold=s["threshold"],
        sync_threshold=s["sync_threshold"],
        conf_threshold=s["conf_threshold"],
        refresh_block_size=refresh,
    )
    per = lambda key: [int(stats[key][b]) for b in sorted(s["block_sizes"])]  # noqa: E731
    forwards = [
        sum(int(stats["nfe_per_block_size"][b][k]) for k in ("nfe_init", "nfe_block", "nfe_refresh"))
        for b in sorted(s["block_sizes"])
    ]
    return {
        "tokens": pack(x[0, len(prompt) :].tolist()),
        "nfe": int(nfe),  # = nfe_init + nfe_block + nfe_refresh of the winner
        "nfe_winner": [int(stats["nfe_init"]), int(stats["nfe_block"]), int(stats["nfe_refresh"])],
        # forwards actually executed (a batched call is one): init, block steps, refreshes
        "forwards": [1, int(stats["batched_block_denoise_count"]), int(stats["refresh_count"])],
        "winner_block_size": int(stats["final_block_size"]),
        "early_exit": stats["final_eos_position"] is not None,
        # per branch, by ascending block size
        "decoded": per("tokens_decoded_per_block_size"),
        "merged": per("tokens_merged_per_block_size"),
        "copied": per("tokens_copied_from_per_block_size"),
        "branch_forwards": forwards,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("authors_file", help="path of llada/generate_blockBatching_original_bulk.py")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "authors_refresh_toy.json")
    )
    ap.add_argument("--prompts", type=int, default=300)
    ap.add_argument("--refresh", type=int, nargs="+", default=list(REFRESH_TOKENS))
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    module = load_authors(args.authors_file)
    ckpt = load_checkpoint(checkpoint_path(), torch.float32)
    model = AuthorsModel(ReferenceModel.from_checkpoint(ckpt), module)
    prompts = encode_all(args.prompts)
    with open(args.authors_file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    runs = {}
    for refresh in args.refresh:
        t0 = time.perf_counter()
        # one row per prompt, the values in RUN_FIELDS order (keeps the fixture small)
        runs[str(refresh)] = [[r[k] for k in RUN_FIELDS] for r in (run_one(module, model, p, refresh) for p in prompts)]
        print(f"refresh {refresh}: {len(prompts)} prompts in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    fixture = {
        "source": "Laurence-Wu/BlockBatch llada/generate_blockBatching_original_bulk.py "
        "(run_fused_block_batching_v2), EOS softmax bf16 cast removed; float32 CPU, toy checkpoint",
        "authors_file_sha256": digest,
        "settings": {**SETTINGS, "temperature": 0.0, "prob_floor": 0.1},
        "problems": {"seed": PROBLEM_SEED, "split": "test", "n": args.prompts},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # torch's float32 softmax kernel
        "prompts": [pack(p) for p in prompts],
        "run_fields": list(RUN_FIELDS),
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
