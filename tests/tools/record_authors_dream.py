"""Record the BlockBatch authors' Dream decoders on a random Dream-shaped checkpoint into a JSON fixture.

The authors' code (github.com/Laurence-Wu/BlockBatch, folder ``dream/``) is not a dependency of this
project and none of it is copied here: this script takes the path of that folder on the command
line and imports three of its files at run time:

* ``model/generation_utils.py``: Dream's own sampler (``DreamGenerationMixin._sample``; the
  vanilla policy, ``alg`` = maskgit_plus / topk_margin / entropy / origin);
* ``model/generation_utils_block.py``: Fast-dLLM's prefix and dual cache for Dream (threshold rule,
  ``alg="confidence_threshold"``);
* ``generate_blockBatching_original_bulk.py``: BlockBatch for Dream (``generate_block_batching``).

``tests/decode/test_dream_reference.py`` then compares ``blockbatch.reference.dream`` against the
recorded outputs, token for token and NFE for NFE.

How the authors' functions are run:

* Their model is Hugging Face Dream (Qwen2 body) with Fast-dLLM's cache interface. ``AuthorsDream``
  below provides that interface on top of our float32 reference model
  (``blockbatch.reference.model.ReferenceModel`` with a Dream checkpoint) on the CPU. A call without
  ``past_key_values`` is a full forward returning per-layer ``(K, V)`` of shape
  ``[batch, L, kv_heads, head_dim]`` (post-RoPE: equivalent to their pre-RoPE cache, since RoPE
  positions are absolute). A call with them and ``dual_cache=True`` is a dual-cache step: the
  queries sit at the positions ``replace_position`` marks (their BlockBatch also publishes them
  in the module global ``_BATCHED_POSITION_IDS``; the two are checked to agree), their K/V
  overwrite those slots of the given cache tensors in place, and attention runs over all ``L``
  keys. A call with them and no ``dual_cache`` is a prefix-cache step (queries after the cached
  prefix). The per-row arithmetic is the reference model's, so the logits are bit-identical to the
  ones our reference decoders see: any difference in the recorded results comes from the policy.
* Their monkey patches of the HF attention class and RoPE function are applied to a stand-in
  class that is never run.
* ``transformers`` is not installed here; the few names their generation files import from it
  (``GenerationConfig``, ``ModelOutput``, ``is_torchdynamo_compiling``, ``logging``) are replaced by
  minimal stand-ins that do what the decoding path needs of them.
* Greedy everywhere (temperature 0). ``origin`` draws from torch's global generator; it is seeded
  with the case's seed right before the call (our reference seeds its own generator the same way).
* ``torch.set_num_threads(1)``: the test runs with the same setting, so every matmul sees the same
  blocking.

Usage (from the repository root, with the package importable)::

    git clone https://github.com/Laurence-Wu/BlockBatch /tmp/BlockBatch   # recorded at 14c3c2e
    PYTHONPATH=python python tests/tools/record_authors_dream.py /tmp/BlockBatch/dream \\
        --out tests/fixtures/authors_dream_random.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import types

import torch

from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.loading import load_checkpoint
from blockbatch.reference.model import ReferenceModel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.dream_cases import CASES, CHECKPOINT, weights_digest  # noqa: E402  (tests/helpers/dream_cases.py)


# ----------------------------------------------------------------------------- stand-ins


def _stub_transformers() -> None:
    if "transformers" in sys.modules:
        return
    tf = types.ModuleType("transformers")
    tf.__version__ = "stand-in"
    gen = types.ModuleType("transformers.generation")
    cfg = types.ModuleType("transformers.generation.configuration_utils")
    utils = types.ModuleType("transformers.utils")

    class GenerationConfig:
        """What their DreamGenerationConfig needs of its base: ``update`` (set known attributes)."""

        def update(self, **kwargs):
            rest = {}
            for key, value in kwargs.items():
                if hasattr(self, key):
                    setattr(self, key, value)
                else:
                    rest[key] = value
            return rest

    class ModelOutput:
        pass

    cfg.GenerationConfig = GenerationConfig
    utils.ModelOutput = ModelOutput
    utils.is_torchdynamo_compiling = lambda: False
    utils.logging = types.SimpleNamespace(get_logger=logging.getLogger)
    tf.generation = gen
    gen.configuration_utils = cfg
    tf.utils = utils
    sys.modules.update(
        {
            "transformers": tf,
            "transformers.generation": gen,
            "transformers.generation.configuration_utils": cfg,
            "transformers.utils": utils,
        }
    )


_attn_module = types.ModuleType("authors_dream_attention_stand_in")


class _AttentionStandIn:  # their BlockBatch patches this class and its module; never run
    def forward(self, *args, **kwargs):
        raise RuntimeError("the Dream attention stand-in is never run")


_AttentionStandIn.__module__ = _attn_module.__name__
_attn_module.AttentionStandIn = _AttentionStandIn
_attn_module.apply_rotary_pos_emb = _AttentionStandIn.forward
sys.modules[_attn_module.__name__] = _attn_module


def _import(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the model


class _Out:
    def __init__(self, logits, past_key_values):
        self.logits = logits
        self.past_key_values = past_key_values


class AuthorsDream:
    """Dream's forward interface (Fast-dLLM cache arguments) over our float32 reference model."""

    bulk = None  # their BlockBatch module, for _BATCHED_POSITION_IDS

    def __init__(self, ref: ReferenceModel):
        self.ref = ref
        c = ref.config
        self.config = types.SimpleNamespace(
            mask_token_id=c.mask_token_id, eos_token_id=c.eos_token_id, max_position_embeddings=c.max_sequence_length
        )
        self.generation_config = types.SimpleNamespace(
            bos_token_id=c.bos_token_id,
            eos_token_id=c.eos_token_id,
            pad_token_id=c.pad_token_id,
            mask_token_id=c.mask_token_id,
        )
        self.device = torch.device("cpu")
        self.model = types.SimpleNamespace(layers=[types.SimpleNamespace(self_attn=_AttentionStandIn())])
        self.forwards = 0

    def _kv_buffer(self, past, b: int, length: int) -> torch.Tensor:
        kv = self.ref.new_kv(1, length)
        for layer, (k, v) in enumerate(past):
            n = k.shape[1]
            kv[0, layer, 0, :, :n] = k[b].transpose(0, 1)
            kv[0, layer, 1, :, :n] = v[b].transpose(0, 1)
        return kv

    def __call__(
        self,
        input_ids,
        attention_mask=None,
        tok_idx=None,
        past_key_values=None,
        use_cache=False,
        dual_cache=False,
        replace_position=None,
        position_ids=None,
        **kwargs,
    ):
        assert attention_mask in (None, "full") and tok_idx is None and position_ids is None, "unexpected arguments"
        self.forwards += 1
        B, q = input_ids.shape
        c = self.ref.config
        if past_key_values is None:  # full forward over whole rows
            L = q
            logits, ks, vs = [], [], []
            for b in range(B):
                kv = self.ref.new_kv(1, L)
                logits.append(self.ref.forward([input_ids[b]], [torch.arange(L)], kv, "full")[0])
                ks.append(kv[0, :, 0].permute(0, 2, 1, 3))  # [layers, L, KVH, hd]
                vs.append(kv[0, :, 1].permute(0, 2, 1, 3))
            past = [
                (torch.stack([k[layer] for k in ks]), torch.stack([v[layer] for v in vs]))
                for layer in range(c.n_layers)
            ]
            return _Out(torch.stack(logits), past)
        if dual_cache:
            L = past_key_values[0][0].shape[1]
            logits = torch.zeros(B, q, c.vocab_size)
            published = getattr(self.bulk, "_BATCHED_POSITION_IDS", None) if self.bulk else None
            for b in range(B):
                pos = replace_position[b].nonzero(as_tuple=True)[0]
                n = pos.numel()
                if published is not None:
                    assert torch.equal(published[b, :n], pos), "query positions disagree"
                kv = self._kv_buffer(past_key_values, b, L)
                logits[b, :n] = self.ref.forward([input_ids[b, :n]], [pos], kv, "dual")[0]
                for layer, (k, v) in enumerate(past_key_values):
                    k[b] = kv[0, layer, 0].transpose(0, 1)
                    v[b] = kv[0, layer, 1].transpose(0, 1)
            return _Out(logits, past_key_values)
        # prefix cache: the queries follow the cached prefix [0, s)
        s = past_key_values[0][0].shape[1]
        logits = []
        for b in range(B):
            kv = self._kv_buffer(past_key_values, b, s + q)
            logits.append(self.ref.forward([input_ids[b]], [torch.arange(s, s + q)], kv, "prefix", prefix_lens=[s])[0])
        return _Out(torch.stack(logits), None)


# ----------------------------------------------------------------------------- recording


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dream_dir", help="the authors' dream/ folder (Laurence-Wu/BlockBatch)")
    parser.add_argument("--out", default="tests/fixtures/authors_dream_random.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    _stub_transformers()
    vanilla = _import(os.path.join(args.dream_dir, "model", "generation_utils.py"), "authors_dream_vanilla")
    block = _import(os.path.join(args.dream_dir, "model", "generation_utils_block.py"), "authors_dream_block")
    bulk = _import(os.path.join(args.dream_dir, "generate_blockBatching_original_bulk.py"), "authors_dream_bulk")
    AuthorsDream.bulk = bulk
    commit = subprocess.run(["git", "-C", args.dream_dir, "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = commit.stdout.strip() or "unknown"

    with tempfile.TemporaryDirectory() as folder:
        make_random_checkpoint(folder, **CHECKPOINT, family="dream")
        ck = load_checkpoint(folder)
    ref = ReferenceModel.from_checkpoint(ck)
    cfg = ref.config

    class Vanilla(AuthorsDream, vanilla.DreamGenerationMixin):
        pass

    class Cached(AuthorsDream, block.DreamGenerationMixin):
        pass

    records = []
    t0 = time.time()
    for case in CASES:
        prompt = torch.tensor([case["prompt"]])
        policy = case["policy"]
        if policy == "vanilla":
            model = Vanilla(ref)
            gc = vanilla.DreamGenerationConfig(
                max_new_tokens=case["gen_length"],
                steps=case["steps"],
                alg=case["alg"],
                alg_temp=case.get("alg_temp"),
                eps=case.get("eps", 1e-3),
                temperature=0.0,
                mask_token_id=cfg.mask_token_id,
                eos_token_id=cfg.eos_token_id,
                pad_token_id=cfg.pad_token_id,
                bos_token_id=cfg.bos_token_id,
                top_p=case.get("top_p"),
                top_k=case.get("top_k"),
            )
            torch.manual_seed(case.get("seed", 0))
            with contextlib.redirect_stdout(io.StringIO()):
                out = model.diffusion_generate(prompt, generation_config=gc)
            tokens, nfe, stats = out[0].tolist(), model.forwards, {}
        elif policy in ("dual", "prefix"):
            model = Cached(ref)
            gc = block.DreamGenerationConfig(
                max_new_tokens=case["gen_length"],
                steps=case["gen_length"],
                alg="confidence_threshold",
                temperature=0.0,
                mask_token_id=cfg.mask_token_id,
                eos_token_id=cfg.eos_token_id,
                pad_token_id=cfg.pad_token_id,
                bos_token_id=cfg.bos_token_id,
                top_p=case.get("top_p"),
                top_k=case.get("top_k"),
            )
            out = model.diffusion_generate(
                prompt,
                generation_config=gc,
                threshold=case["threshold"],
                block_length=case["block_length"],
                dual_cache=policy == "dual",
            )
            tokens, nfe, stats = out[0].tolist(), model.forwards, {}
        else:
            model = AuthorsDream(ref)
            out, nfe, raw = bulk.generate_block_batching(
                model,
                prompt,
                gen_length=case["gen_length"],
                block_sizes=list(case["block_sizes"]),
                mask_id=cfg.mask_token_id,
                threshold=case.get("threshold", 0.9),
                refresh_block_size=case.get("refresh_tokens", 32),
                sync_threshold=case.get("sync_gap", 8),
                stop_on_eos=case["stop_on_eos"],
            )
            assert nfe == model.forwards, (nfe, model.forwards)
            tokens = out[0].tolist()
            stats = {k: raw[k] for k in ("nfe_init", "nfe_block", "nfe_refresh", "final_block_size", "exit_reason")}
            trace = raw.get("token_event_trace", {})
            stats.update({k: trace.get(k, 0) for k in ("merged_tokens", "copied_tokens")})
        records.append({**case, "tokens": tokens, "nfe": nfe, "stats": stats})
        print(f"{case['name']}: nfe {nfe} {stats}", flush=True)

    fixture = {
        "source": "github.com/Laurence-Wu/BlockBatch dream/ (generation_utils.py, generation_utils_block.py, "
        "generate_blockBatching_original_bulk.py), run by tests/tools/record_authors_dream.py",
        "authors_commit": commit,
        "torch": torch.__version__,
        "checkpoint": CHECKPOINT,
        "weights_sha256": weights_digest(ck.weights),
        "cases": records,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(records)} cases in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
