"""Record the Window-Diffusion authors' LLaDA decoder on the shipped LLaDA toy into a JSON fixture.

The authors' code (github.com/vhicrgit/Window-Diffusion, ``llada/model/modeling_llada.py``, function
``generate``) is not a dependency of this project and none of it is copied here: this script takes
the path of that file on the command line (e.g. ``git --git-dir=<fetched>/repo show
HEAD:llada/model/modeling_llada.py > /tmp/wd_modeling_llada.py``) and imports it at run time.
``tests/decode/test_window.py`` then compares the engine and the Python reference
(``blockbatch.reference.window``) against the recorded outputs, token for token and NFE for NFE.

How their ``generate`` is run: as it is (its phases, plans, schedule, argmax / float32 softmax
confidence and ``torch.topk`` selections), with its two forwards, the module functions
``llada_forward_full`` and ``llada_forward_prune``, replaced by our float32 reference model
(``blockbatch.reference.model``) on the CPU, so that the logits are bit-identical to the ones our
reference decoder sees and any difference in the recorded results comes from the policy:

* ``llada_forward_full(tr, cfg, blocks, x, cache_mgr)``: a full forward over the canvas; each
  layer's post-RoPE K/V ``[1, kv_heads, L, head_dim]`` go to ``cache_mgr.write`` as their
  ``block_forward_full`` writes them;
* ``llada_forward_prune(tr, cfg, blocks, pos_embed, x, cache_mgr, plan)``: the rule of their
  ``block_forward_prune``: the active positions ``plan.active_idx`` at their absolute positions,
  each layer writing their K/V into the cache in place before attending the keys
  ``plan.window_idx`` (our reference's dual mode with a gathered key set).

The model object their ``generate`` unwraps is a stand-in holding what it reads (``device``,
``model.transformer.blocks`` and ``blocks[0].rotary_emb.get_rotary_embedding``, ``config``).
Forwards are counted by the two adapters (the NFE). cfg_scale 0 and remasking low_confidence
(their benchmark settings); greedy, and two settings with their Gumbel sampling (temperature > 0,
torch's global generator seeded with the setting's seed right before the call).

Usage (from the repository root, with the package importable)::

    PYTHONPATH=python python tests/tools/record_authors_window.py /tmp/wd_modeling_llada.py \\
        --out tests/fixtures/authors_window_llada.json
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

PROBLEM_SEED = 57
# (gen_length, steps, window_tokens, active_tokens, refresh_interval): the authors' settings
# (window 64, active 16, refresh 32, one token per step) and smaller windows and phases that prune
# harder, two tokens per step, mixed counts, an empty mask window, and a full forward every step.
SETTINGS = (
    (64, 64, 64, 16, 32),
    (64, 64, 16, 4, 8),
    (64, 32, 8, 2, 4),
    (64, 48, 0, 3, 5),
    (64, 64, 32, 8, 1),
    (32, 32, 4, 1, 16),
    # sampled: (..., temperature, seed); their Gumbel noise draws from torch's global generator,
    # seeded with the seed right before the call
    (64, 64, 16, 4, 8, 3.0, 3),
    (64, 32, 8, 2, 4, 3.0, 5),
)
FIELDS = ("gen_length", "steps", "window_tokens", "active_tokens", "refresh_interval", "temperature", "seed")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"  # token ids as one base-36 digit each (toy vocab: 21)


def pack(ids) -> str:
    return "".join(DIGITS[int(i)] for i in ids)


def setting_key(s) -> str:
    key = "gen{}_steps{}_w{}_a{}_r{}".format(*s[:5])
    return key + "_t{}_s{}".format(*s[5:]) if len(s) > 5 else key


def load_authors(path: str) -> types.ModuleType:
    module = types.ModuleType("authors_window_llada")
    module.__file__ = path
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if "def generate(" not in source or "def llada_forward_prune(" not in source:
        raise SystemExit(f"{path}: no generate / llada_forward_prune; is this llada/model/modeling_llada.py?")
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 (their file, run as their module)
    return module


class Adapter:
    """Their forwards over our reference model (module docstring), counting them."""

    def __init__(self, ref: ReferenceModel, module: types.ModuleType):
        self.ref = ref
        self.full = self.pruned = self.keys = 0
        self.queries: list[int] = []
        module.llada_forward_full = self.forward_full
        module.llada_forward_prune = self.forward_prune
        rope = types.SimpleNamespace(get_rotary_embedding=lambda seq_len, device: None)
        block = types.SimpleNamespace(rotary_emb=rope)
        tr = types.SimpleNamespace(blocks=[block] * ref.config.n_layers)
        self.model = types.SimpleNamespace(
            device=torch.device("cpu"), model=types.SimpleNamespace(transformer=tr), config=ref.config
        )

    def forward_full(self, tr, cfg, blocks, x, cache_mgr):
        assert x.shape[0] == 1, "cfg_scale 0: one row"
        L = x.shape[1]
        kv = self.ref.new_kv(1, L)
        [logits] = self.ref.forward([x[0]], [torch.arange(L)], kv, "full")
        for layer in range(self.ref.config.n_layers):
            cache_mgr.write(layer, kv[:, layer, 0].clone(), kv[:, layer, 1].clone())
        self.full += 1
        self.queries.append(L)
        return logits[None]

    def forward_prune(self, tr, cfg, blocks, pos_embed, x, cache_mgr, plan):
        assert x.shape[0] == 1 and x.shape[1] == plan.active_idx.numel()
        n_layers = self.ref.config.n_layers
        caches = [cache_mgr.layer_caches[layer] for layer in range(n_layers)]
        kv = torch.stack([torch.stack([c.key, c.value], 1) for c in caches], 1)  # [1, layers, 2, H, L, hd]
        [logits] = self.ref.forward([x[0]], [plan.active_idx], kv, "dual", key_positions=[plan.window_idx])
        for layer, c in enumerate(caches):  # their cache is written in place
            c.key.copy_(kv[:, layer, 0])
            c.value.copy_(kv[:, layer, 1])
        self.pruned += 1
        self.keys += plan.window_idx.numel()
        self.queries.append(plan.active_idx.numel())
        return logits[None]


def encode_all(n: int) -> list[list[int]]:
    ckpt = load_checkpoint(checkpoint_path())
    codec = TextCodec(ckpt.tokenizer, ckpt.config, ckpt.chat_template)
    return [codec.encode(p.prompt, chat=False) for p in task.make_problems(n, PROBLEM_SEED, "test")]


RUN_FIELDS = ("tokens", "nfe", "nfe_full", "nfe_pruned", "pruned_key_tokens", "query_tokens")


def run_one(module, ref: ReferenceModel, prompt: list[int], s) -> list:
    gen_length, steps, window_tokens, active_tokens, refresh, temperature, seed = (*s, 0.0, 0)[:7]
    a = Adapter(ref, module)
    torch.manual_seed(seed)
    x = module.generate(
        a.model,
        torch.tensor([prompt]),
        steps=steps,
        gen_length=gen_length,
        temperature=temperature,
        cfg_scale=0.0,
        remasking="low_confidence",
        mask_id=ref.config.mask_token_id,
        window_tokens=window_tokens,
        active_tokens=active_tokens,
        refresh_cycle=refresh,
    )
    return [pack(x[0, len(prompt) :].tolist()), a.full + a.pruned, a.full, a.pruned, a.keys, sum(a.queries)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("authors_file", help="path of llada/model/modeling_llada.py")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "authors_window_llada.json")
    )
    ap.add_argument("--prompts", type=int, default=60)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    module = load_authors(args.authors_file)
    ref = ReferenceModel.from_checkpoint(load_checkpoint(checkpoint_path(), torch.float32))
    prompts = encode_all(args.prompts)
    with open(args.authors_file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    runs = {}
    for s in SETTINGS:
        t0 = time.perf_counter()
        runs[setting_key(s)] = [run_one(module, ref, p, s) for p in prompts]
        print(f"{setting_key(s)}: {len(prompts)} prompts in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    fixture = {
        "source": "vhicrgit/Window-Diffusion llada/model/modeling_llada.py (generate), its forwards on our "
        "float32 reference model; CPU, LLaDA toy checkpoint, run by tests/tools/record_authors_window.py",
        "authors_file_sha256": digest,
        "settings": {setting_key(s): dict(zip(FIELDS, (*s, 0.0, 0)[:7])) for s in SETTINGS},
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
