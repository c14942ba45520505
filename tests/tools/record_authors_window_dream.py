"""Record the Window-Diffusion authors' Dream decoder on the shipped Dream toy into a JSON fixture.

The authors' code (github.com/vhicrgit/Window-Diffusion, ``dream/model/generation_utils.py``, method
``nearest_sample_fast_v2_cache`` of ``DreamGenerationMixin``) is not a dependency of this project and
none of it is copied here: this script takes the path of that file on the command line (e.g. ``git
--git-dir=<fetched>/repo show HEAD:dream/model/generation_utils.py > /tmp/wd_generation_utils.py``)
and imports it at run time (it imports ``transformers``: ``pip install transformers`` first).
``tests/decode/test_window_dream.py`` then compares the engine and the Python reference
(``blockbatch.reference.window.dream_window_generate``) against the recorded outputs, token for token
and forward for forward.

How their method is run: as it is (its phases, kept prefix, active span, shifted logits, timestep
schedule, ``sample_tokens`` with ``neg_entropy``, ``torch.topk`` / ``torch.multinomial`` selections,
``slide_window`` and ``early_stop``), on a stand-in for their ``DreamModel`` whose forward is our
float32 reference model (``blockbatch.reference.model``) on the CPU, so that the logits are
bit-identical to the ones our reference decoder sees. One line of their file is changed as it is
loaded: ``eos_id = 151643`` (Dream-v0's id, hard-coded) becomes the checkpoint's EOS id.

The stand-in's forward follows their ``DreamModel.forward`` with their ``KVCache``:

* a full step (``prv_cache_position`` None): the step's tokens at positions ``position_ids`` attend
  each other; each layer's K/V go to the cache rows ``cache_position``;
* a pruned step: the queries are the positions of ``position_ids`` that are not in
  ``prv_cache_position``; each layer writes their K/V into the cache rows ``cache_position``
  (``update_and_read``) and attends the cache rows ``[0, len(position_ids))``.

Their cache (``torch.empty`` at each refresh, bfloat16, 4 KV heads of 128 hard-coded) is replaced by
one of the toy's shape in float32 whose refresh fills it with NaN, so that a read of a row their
code never wrote shows up as NaN logits instead of as whatever memory held; the recorder refuses to
record such a run (and a run whose scatter would drop rows of the span) rather than record garbage.
Forwards and query / key tokens are counted by the stand-in (the NFE).

Usage (from the repository root, with the package importable)::

    PYTHONPATH=python python tests/tools/record_authors_window_dream.py /tmp/wd_generation_utils.py \\
        --out tests/fixtures/authors_window_dream.json
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.packing import pack  # noqa: E402

from blockbatch.loading import load_checkpoint  # noqa: E402
from blockbatch.reference.model import ReferenceModel  # noqa: E402
from blockbatch.tokenization import TextCodec  # noqa: E402
from blockbatch.toy import checkpoint_path, task  # noqa: E402

PROBLEM_SEED = 57
FAMILY = "dream"
# (gen_length, steps, window_tokens, active_tokens, refresh_interval, slide_window, early_stop,
#  temperature, top_p, alg_temp, seed). Their o_win_size is window_tokens + 1 (they keep the masks of
# rank < o_win_size), their i_win_size is active_tokens. Their benchmark settings (o_win 128 / i_win 16 /
# refresh 32 / slide, one token per step; the instruct row: early_stop, temperature 0.1, top_p 0.9),
# then smaller windows and phases, two tokens per step, a frozen span, early_stop greedy, a sampled
# setting hot enough to change answers, and alg_temp's drawn selection.
SETTINGS = (
    (64, 64, 127, 16, 32, True, False, 0.0, None, 0.0, 0),
    (64, 64, 127, 16, 32, True, True, 0.1, 0.9, 0.0, 1),
    (64, 64, 24, 8, 8, True, False, 0.0, None, 0.0, 0),
    (64, 32, 32, 16, 4, True, False, 0.0, None, 0.0, 0),
    (64, 64, 32, 16, 4, False, False, 0.0, None, 0.0, 0),
    (64, 64, 16, 4, 4, True, True, 0.0, None, 0.0, 0),
    (48, 48, 40, 8, 6, True, False, 2.0, 0.95, 0.0, 3),
    (64, 64, 32, 12, 8, True, False, 0.0, None, 0.5, 5),
)
FIELDS = (
    "gen_length",
    "steps",
    "window_tokens",
    "active_tokens",
    "refresh_interval",
    "slide_window",
    "early_stop",
    "temperature",
    "top_p",
    "alg_temp",
    "seed",
)
RUN_FIELDS = ("tokens", "nfe", "nfe_full", "nfe_pruned", "pruned_key_tokens", "query_tokens", "key_tokens")


def setting_key(s) -> str:
    gen, steps, w, a, r, slide, early, temp, top_p, alg_temp, seed = s
    key = f"gen{gen}_steps{steps}_w{w}_a{a}_r{r}" + ("_slide" if slide else "") + ("_early" if early else "")
    if temp:
        key += f"_t{temp}_p{top_p}_s{seed}"
    if alg_temp:
        key += f"_algt{alg_temp}_s{seed}"
    return key


def load_authors(path: str, eos_id: int) -> types.ModuleType:
    """Their generation_utils.py as module ``authors_window_dream.generation_utils``, its relative
    ``from .cache_utils import KVCache`` answered by the stand-in cache below."""
    package = types.ModuleType("authors_window_dream")
    package.__path__ = []
    cache_module = types.ModuleType("authors_window_dream.cache_utils")
    cache_module.KVCache = StandInCache
    module = types.ModuleType("authors_window_dream.generation_utils")
    module.__file__ = path
    module.__package__ = "authors_window_dream"
    sys.modules.update({package.__name__: package, cache_module.__name__: cache_module, module.__name__: module})
    with open(path, encoding="utf-8") as f:
        source = f.read()
    if "def nearest_sample_fast_v2_cache(" not in source:
        raise SystemExit(f"{path}: no nearest_sample_fast_v2_cache; is this dream/model/generation_utils.py?")
    if source.count("eos_id = 151643") != 1:
        raise SystemExit(f"{path}: expected one hard-coded 'eos_id = 151643' to replace with the checkpoint's")
    source = source.replace("eos_id = 151643", f"eos_id = {int(eos_id)}")
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 (their file, run as their module)
    return module


class StandInCache:
    """Their KVCache's interface over one float32 K/V buffer of the reference model's shape."""

    model: ReferenceModel  # set per run

    def __init__(self, num_hidden_layers: int, max_len: int, head_dim: int, device):
        self.kv = self.model.new_kv(1, max_len)
        self.refresh_cache()

    def refresh_cache(self):
        self.kv.fill_(float("nan"))  # theirs: torch.empty; a row read before it is written shows


class StandInModel:
    """What their method reads of ``self`` (``device``, ``config``, the forward), counting forwards."""

    def __init__(self, ref: ReferenceModel):
        self.ref = ref
        self.device = torch.device("cpu")
        self.config = types.SimpleNamespace(num_hidden_layers=ref.config.n_layers)
        self.full = self.pruned = self.pruned_keys = 0
        self.queries: list[int] = []
        self.keys: list[int] = []

    def __call__(
        self, step_x, attention_mask, position_ids, use_cache, cache_position, prv_cache_position, past_key_values
    ):
        assert attention_mask == "full" and use_cache and step_x.shape[0] == 1
        kv = past_key_values.kv
        written = cache_position[0]
        if prv_cache_position is None:  # full: the step's tokens attend each other, their K/V written
            pos = position_ids[0]
            if pos.numel() != step_x.shape[1] or not torch.equal(written, pos):
                raise RuntimeError(f"full step: positions {pos.tolist()} / cache rows {written.tolist()}")
            [logits] = self.ref.forward([step_x[0]], [pos], kv, "full")
            self.full += 1
            self.queries.append(pos.numel())
            self.keys.append(pos.numel())
        else:  # pruned: the span's K/V written into the cache, keys = the cache rows [0, len(position_ids))
            P = position_ids.shape[1]
            current = torch.ones(P, dtype=torch.bool)
            current[prv_cache_position[0]] = False
            pos = position_ids[0][current]
            if pos.numel() != step_x.shape[1] or not torch.equal(written, pos):
                raise RuntimeError(
                    f"pruned step: their scatter writes cache rows {written.tolist()} for the span "
                    f"{pos.tolist()} (a span past the kept prefix): not recorded"
                )
            [logits] = self.ref.forward([step_x[0]], [pos], kv, "dual", key_positions=[torch.arange(P)])
            self.pruned += 1
            self.pruned_keys += P
            self.queries.append(pos.numel())
            self.keys.append(P)
        if not torch.isfinite(logits).all():
            raise RuntimeError("non-finite logits: their step read cache rows it never wrote; not recorded")
        return types.SimpleNamespace(logits=logits[None])


def encode_all(n: int) -> list[list[int]]:
    ckpt = load_checkpoint(checkpoint_path(FAMILY))
    codec = TextCodec(ckpt.tokenizer, ckpt.config, ckpt.chat_template)
    return [codec.encode(p.prompt, chat=False) for p in task.make_problems(n, PROBLEM_SEED, "test")]


def run_one(module, ref: ReferenceModel, prompt: list[int], s) -> list:
    gen, steps, w, a, r, slide, early, temp, top_p, alg_temp, seed = s
    model = StandInModel(ref)
    StandInCache.model = ref
    config = types.SimpleNamespace(
        output_history=False,
        return_dict_in_generate=False,
        max_length=len(prompt) + gen,
        mask_token_id=ref.config.mask_token_id,
        steps=steps,
        eps=1e-3,
        alg="entropy",
        alg_temp=alg_temp,
        temperature=temp,
        top_p=top_p,
        top_k=None,
    )
    torch.manual_seed(seed)
    x = module.DreamGenerationMixin.nearest_sample_fast_v2_cache(
        model,
        torch.tensor([prompt]),
        attention_mask=None,
        generation_config=config,
        generation_tokens_hook_func=None,
        generation_logits_hook_func=None,
        o_win_size=w + 1,
        i_win_size=a,
        refresh_cycle=r,
        early_stop=early,
        slide_window=slide,
    )
    return [
        pack(x[0, len(prompt) :].tolist()),
        model.full + model.pruned,
        model.full,
        model.pruned,
        model.pruned_keys,
        sum(model.queries),
        sum(model.keys),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("authors_file", help="path of dream/model/generation_utils.py")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "authors_window_dream.json")
    )
    ap.add_argument("--prompts", type=int, default=60)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    ckpt = load_checkpoint(checkpoint_path(FAMILY), torch.float32)
    module = load_authors(args.authors_file, ckpt.config.eos_token_id)
    ref = ReferenceModel.from_checkpoint(ckpt)
    prompts = encode_all(args.prompts)
    with open(args.authors_file, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    runs = {}
    for s in SETTINGS:
        t0 = time.perf_counter()
        runs[setting_key(s)] = [run_one(module, ref, p, s) for p in prompts]
        print(f"{setting_key(s)}: {len(prompts)} prompts in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    fixture = {
        "source": "vhicrgit/Window-Diffusion dream/model/generation_utils.py (nearest_sample_fast_v2_cache; "
        "its eos_id the checkpoint's), its forward on our float32 reference model; CPU, Dream toy checkpoint, "
        "run by tests/tools/record_authors_window_dream.py",
        "authors_file_sha256": digest,
        "settings": {setting_key(s): dict(zip(FIELDS, s)) for s in SETTINGS},
        "problems": {"seed": PROBLEM_SEED, "split": "test", "n": args.prompts},
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
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
