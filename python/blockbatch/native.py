"""Python face of the native model: ``torch.classes.blockbatch.Model`` + ``torch.ops.blockbatch.forward``."""

from __future__ import annotations

from typing import Sequence

import torch

from . import contract, policies
from ._C_loader import load_extension
from .config import ModelConfig
from .loading import Checkpoint, load_checkpoint

load_extension()

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_SCALAR_NAMES = {"Float": "float32", "BFloat16": "bfloat16", "Half": "float16"}  # c10::toString


def pack_rows(
    ids: Sequence[torch.Tensor], positions: Sequence[torch.Tensor], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack per-row query ids/positions into (tokens ``[T]``, positions ``[T]``, cu_seqlens ``[R+1]``)."""
    if len(ids) != len(positions):
        raise ValueError(f"ids has {len(ids)} rows but positions has {len(positions)}")
    lengths = [int(t.numel()) for t in ids]
    for r, (i, p) in enumerate(zip(ids, positions)):
        if i.numel() != p.numel():
            raise ValueError(f"row {r}: {i.numel()} ids but {p.numel()} positions")
    cu = torch.zeros(len(ids) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.long), 0)
    tokens = torch.cat([t.reshape(-1).long() for t in ids]) if ids else torch.zeros(0, dtype=torch.long)
    pos = torch.cat([p.reshape(-1).long() for p in positions]) if positions else torch.zeros(0, dtype=torch.long)
    return tokens.to(device), pos.to(device), cu.to(device)


class NativeModel:
    """A model of any supported family (LLaDA, Dream) held by the C++ engine.

    >>> model = NativeModel.from_pretrained("path/to/checkpoint", dtype=torch.bfloat16)
    >>> logits = model.forward([ids], [positions])[0]          # [len(ids), vocab]
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        proposal_vocab: int | None = None,
    ):
        if dtype is not None and dtype not in _DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {list(_DTYPE_NAMES)}, got {dtype}")
        self.config = config
        self.device = torch.device(device)
        on_device = {k: v.to(self.device) for k, v in weights.items()}
        # proposal_vocab: the decoders propose ids below it only (None: every id; see
        # Checkpoint.proposal_vocab: the ids the checkpoint's tokenizer can produce, Dream family)
        ints = config.int_fields() | ({"proposal_vocab": int(proposal_vocab)} if proposal_vocab else {})
        self.proposal_vocab = proposal_vocab
        self.obj = torch.classes.blockbatch.Model(
            ints, config.float_fields(), on_device, _DTYPE_NAMES[dtype] if dtype is not None else ""
        )
        self.dtype = next(d for d, name in _DTYPE_NAMES.items() if name == _SCALAR_NAMES[self.obj.dtype()])

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, dtype: torch.dtype | None = None, device: torch.device | str = "cpu"
    ) -> "NativeModel":
        return cls(checkpoint.config, checkpoint.weights, dtype, device, checkpoint.proposal_vocab)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        dtype: torch.dtype | None = None,
        device: torch.device | str = "cpu",
        check_finite: bool | None = None,
    ) -> "NativeModel":
        """``check_finite``: refuse NaN / Inf weights (None: BLOCKBATCH_CHECK_FINITE, default on)."""
        return cls.from_checkpoint(load_checkpoint(path, check_finite=check_finite), dtype, device)

    def new_kv(self, rows: int, length: int) -> torch.Tensor:
        """Zeroed KV buffer ``[rows, layers, 2, kv_heads, length, head_dim]``."""
        return self.obj.new_kv(rows, length)

    def forward_packed(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cu_seqlens: torch.Tensor,
        kv: torch.Tensor | None = None,
        mode: str = "full",
        kv_rows: torch.Tensor | None = None,
        prefix_lens: torch.Tensor | None = None,
        logit_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The raw op: logits ``[n, vocab]`` for packed rows (see ``torch.ops.blockbatch.forward``)."""
        return torch.ops.blockbatch.forward(
            self.obj, tokens, positions, cu_seqlens, kv, kv_rows, prefix_lens, mode, logit_index
        )

    def forward(
        self,
        ids: Sequence[torch.Tensor],
        positions: Sequence[torch.Tensor],
        kv: torch.Tensor | None = None,
        mode: str = "full",
        kv_rows: Sequence[int] | None = None,
        prefix_lens: Sequence[int] | None = None,
    ) -> list[torch.Tensor]:
        """Same contract as ``ReferenceModel.forward``: per-row logits ``[len(ids[r]), vocab]`` (float32)."""
        tokens, pos, cu = pack_rows(ids, positions, self.device)
        rows = torch.tensor(list(kv_rows), dtype=torch.long, device=self.device) if kv_rows is not None else None
        pre = torch.tensor(list(prefix_lens), dtype=torch.long, device=self.device) if prefix_lens is not None else None
        logits = self.forward_packed(tokens, pos, cu, kv, mode, rows, pre).float()
        return list(torch.split(logits, [int(t.numel()) for t in ids]))


@torch.library.register_fake("blockbatch::decode")
def _decode_fake(model, prompt_ids, **options):
    # Outputs live on the host; the number of forwards is data-dependent. The options are the
    # op's keyword-only arguments (the table of blockbatch.contract), defaults filled in.
    o = {**contract.DEFAULTS, **options}
    forwards = torch.library.get_ctx().new_dynamic_size()
    if not policies.get(o["policy"]).MULTI_BRANCH:
        branches = 1
    elif o["block_sizes"] is None:  # the model family's default list: its length depends on the checkpoint
        branches = torch.library.get_ctx().new_dynamic_size()
    else:
        branches = len(o["block_sizes"])
    cpu = torch.device("cpu")
    return (
        torch.empty(prompt_ids.shape[0] + o["gen_length"], dtype=torch.long, device=cpu),
        torch.empty(len(torch.ops.blockbatch.decode_stat_names()), dtype=torch.float64, device=cpu),
        torch.empty(forwards, 2, dtype=torch.long, device=cpu),
        torch.empty(branches, 5, dtype=torch.long, device=cpu),
        torch.empty(
            *((o["gen_length"], 1 + 2 * o["logprobs"]) if o["logprobs"] is not None else (0, 0)),
            dtype=torch.float64,
            device=cpu,
        ),
    )
