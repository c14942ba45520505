"""The checkpoint and the cases recorded in tests/fixtures/authors_dream_random.json.

Shared by the recorder (tests/tools/record_authors_dream.py) and tests/decode/test_dream_reference.py.
The checkpoint is random (``blockbatch.random_checkpoint.make_random_checkpoint(..., family="dream")``) and rebuilt
by the test from these settings; its weights' digest is recorded so that a change of the
generator (or of torch's ``randn``) is reported as such, not as a decoding difference. With a
32-token vocabulary (EOS 30, mask 31) and the LM head scaled by 5 the model is confident enough
that the threshold rules commit several tokens a step, EOS appears, and BlockBatch's merges, syncs,
refreshes and EOS exits all fire.
"""

from __future__ import annotations

import hashlib

import torch

CHECKPOINT = dict(seed=1, logit_scale=5.0, vocab_size=32)
EOS = 30  # vocab_size - 2 (the pad and bos id as well)

PROMPTS = {
    "p3": [1, 2, 3],
    "p7": [4, 5, 6, 7, 8, 9, 10],
    "pad5": [EOS, 11, 12, 13, 14],  # the pad id as real input: no attention mask over prompt tokens
    "p12": [17, 3, 22, 9, 9, 1, 28, 5, 14, 2, 7, 19],
}


def _cases() -> list[dict]:
    cases = []
    for alg in ("maskgit_plus", "topk_margin", "entropy", "origin"):
        for name in ("p3", "p7"):
            cases.append(
                dict(
                    name=f"vanilla-{alg}-{name}",
                    policy="vanilla",
                    alg=alg,
                    prompt=PROMPTS[name],
                    gen_length=32,
                    steps=16,
                    seed=5,
                )
            )
    cases.append(
        dict(
            name="vanilla-entropy-pad5-steps32",
            policy="vanilla",
            alg="entropy",
            prompt=PROMPTS["pad5"],
            gen_length=32,
            steps=32,
            seed=0,
        )
    )
    cases.append(
        dict(
            name="vanilla-entropy-p12-top_p",
            policy="vanilla",
            alg="entropy",
            prompt=PROMPTS["p12"],
            gen_length=32,
            steps=16,
            seed=0,
            top_p=0.9,
        )
    )
    cases.append(
        dict(
            name="vanilla-entropy-p12-top_k",
            policy="vanilla",
            alg="entropy",
            prompt=PROMPTS["p12"],
            gen_length=32,
            steps=16,
            seed=0,
            top_k=2,
        )
    )
    cases.append(
        dict(
            name="vanilla-entropy-p7-alg_temp",
            policy="vanilla",
            alg="entropy",
            prompt=PROMPTS["p7"],
            gen_length=32,
            steps=16,
            seed=11,
            alg_temp=0.5,
        )
    )
    for policy in ("dual", "prefix"):
        for name in ("p3", "p7", "pad5", "p12"):
            cases.append(
                dict(
                    name=f"{policy}-{name}",
                    policy=policy,
                    prompt=PROMPTS[name],
                    gen_length=64,
                    block_length=32,
                    threshold=0.9,
                )
            )
    for stop in (False, True):
        for name in ("p3", "p7", "pad5", "p12"):
            cases.append(
                dict(
                    name=f"blockbatch-{'eos' if stop else 'full'}-{name}",
                    policy="blockbatch",
                    prompt=PROMPTS[name],
                    gen_length=64,
                    block_sizes=[4, 8, 16, 32, 64],
                    threshold=0.9,
                    refresh_tokens=32,
                    sync_gap=8,
                    stop_on_eos=stop,
                )
            )
    return cases


CASES = _cases()


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()
