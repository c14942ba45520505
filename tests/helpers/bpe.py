"""A small random checkpoint with the byte-level BPE tokenizer and the LLaDA2-style chat template
(``blockbatch make-random --tokenizer bpe``), made in a test's tmp folder."""

from __future__ import annotations

from pathlib import Path

from blockbatch import families
from blockbatch.random_checkpoint import make_random_checkpoint
from blockbatch.random_tokenizer import CHAT_TEMPLATE, build_bpe_tokenizer

VOCAB = 512


def make_bpe_checkpoint(folder: Path, family: str = "llada", vocab: int = VOCAB, template: str | None = CHAT_TEMPLATE):
    """Write it (d_model 64, one layer: made and loaded in well under a second) and return ``folder``."""
    overrides = dict(d_model=64, n_layers=1, n_heads=2, mlp_hidden_size=128, vocab_size=vocab)
    overrides["n_kv_heads"] = families.get(family).default_kv_heads(2)
    make_random_checkpoint(
        folder,
        family=family,
        tokenizer=build_bpe_tokenizer(vocab),
        chat_template=template,
        eos_token_id=vocab - 2,
        mask_token_id=vocab - 1,
        **overrides,
    )
    return folder


def train_to_reply(
    folder: Path, prompt_ids: list[int], reply: str, gen_length: int = 32, steps: int = 600, batch: int = 4
):
    """Overwrite the LLaDA checkpoint in ``folder`` with weights fitted (by the float32 reference's
    differentiable forward, masked-diffusion loss) to answer ``prompt_ids`` with ``reply`` then EOS up
    to ``gen_length`` tokens: a model that really writes a given reply (a tool call, say), so the
    server's handling of it is tested on a decode, not on a made-up text. Returns the reply's ids."""
    import torch

    from blockbatch.loading import load_checkpoint, save_checkpoint
    from blockbatch.reference.model import ReferenceModel

    ck = load_checkpoint(str(folder))
    config, tok = ck.config, ck.tokenizer
    target = tok.encode(reply, add_special_tokens=False).ids
    assert len(target) < gen_length, f"the reply is {len(target)} tokens, gen_length {gen_length}"
    target = target + [config.eos_token_id] * (gen_length - len(target))
    torch.manual_seed(0)
    weights = {k: v.detach().clone().float().requires_grad_(True) for k, v in ck.weights.items()}
    model = ReferenceModel(config, weights)
    opt = torch.optim.Adam(weights.values(), lr=3e-3)
    full = torch.tensor(prompt_ids + target)
    n = len(prompt_ids)
    right = 0  # consecutive batches whose every masked position the model gets right
    for _ in range(steps):
        ids = full.repeat(batch, 1)
        ratio = torch.rand(batch, 1)
        masked = torch.rand(batch, gen_length) < ratio
        masked[:, 0] |= ~masked.any(1)  # at least one masked position a row
        ids[:, n:][masked] = config.mask_token_id
        logits = model.forward_batch(ids)[:, n:]
        loss = torch.nn.functional.cross_entropy(logits[masked], full[n:].repeat(batch, 1)[masked])
        right = right + 1 if bool((logits[masked].argmax(-1) == full[n:].repeat(batch, 1)[masked]).all()) else 0
        if right == 30:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_checkpoint(
        folder, config, {k: v.detach() for k, v in weights.items()}, tokenizer=tok, chat_template=ck.chat_template
    )
    return target
