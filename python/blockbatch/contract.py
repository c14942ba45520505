"""The decoding options contract: one table, from which everything else is derived.

Every option of ``torch.ops.blockbatch.decode`` is one row of :data:`OPTIONS` below: name, type,
default, range, the policies it applies to, per-policy and per-model-family defaults, and a
one-line doc. From this table:

- ``csrc/decode/options_table.{h,cpp}`` (generated): the C++ ``DecodeOptions`` struct and its
  defaults, the option enums and their parsers, the range checks with their messages, the
  per-policy / per-family default resolution, the text parser of ``bb_bench_decode``'s flags;
- ``csrc/torch/decode_args.h`` (generated): the op schema (keyword-only options) and the reader
  of the op's boxed arguments;
- at import, in Python: ``blockbatch.DecodeOptions`` (fields, defaults, type checks), the
  ``blockbatch generate`` flags, the ``name:key=value`` parsers of ``blockbatch bench`` and the
  lm-eval model, the fake (meta) kernel of the decode op;
- the options table of ``docs/options.md`` (the manual's "Decoding options" page).

Regenerate after editing the table: ``python tools/gen_contract.py --write`` (``--check``, run in CI
and by ``tests/tools/test_contract.py``, fails when a generated file is out of date).

Value checks live in C++ only (``DecodeOptions::validate``: the generated range checks plus the
rules that relate options to each other); ``DecodeOptions`` in Python checks the types and calls
that validator through ``torch.ops.blockbatch.options``, so both languages give the same
message. This module imports nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

POLICIES = ("vanilla", "prefix", "dual", "blockbatch", "block", "window", "wavefront")
BLOCK_CAUSAL = ("block", "wavefront")  # the block-causal families' decoders: they read the block options
SINGLE_BRANCH = ("vanilla", "prefix", "dual")
FAMILIES = (
    "llada",
    "dream",
    "llada2",
    "sdar",
)  # model families; the first is the default (the table's "default" column)


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    type: str  # "int" | "float" | "bool" | "str" | "int[]"
    default: Any  # the default for every policy and family unless overridden
    doc: str  # one line
    policies: tuple[str, ...] = POLICIES  # the policies that read it
    optional: bool = False  # None is a value (see none_doc)
    none_doc: str = ""  # what None means
    choices: tuple[str, ...] = ()  # type str: the accepted values
    cpp_enum: str = ""  # type str: the C++ enum type ...
    cpp_values: tuple[str, ...] = ()  # ... and its enumerators, in `choices` order
    lo: Optional[float] = None  # range: lo <= v (lo < v when lo_open)
    lo_open: bool = False
    hi: Optional[float] = None  # v <= hi (v < hi when hi_open)
    hi_open: bool = False
    max_items: Optional[int] = None  # type int[]: at most this many entries (each checked by lo / hi)
    by_policy: tuple[tuple[str, Any], ...] = ()  # (policy, default) where it differs (value None: resolve)
    # (family, default) or ("family:policy", default) where it differs from the columns above
    by_family: tuple[tuple[str, Any], ...] = ()
    group: str = "decoding"  # the --help group

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def resolved_by_table(self) -> bool:
        """None is resolved to a per-policy / per-family default (rather than meaning 'unset')."""
        return bool(self.by_policy or self.by_family)

    def default_for(self, policy: str, family: str = FAMILIES[0]) -> Any:
        """The default when the caller passes None: the family's for this policy, else the family's,
        else the policy's, else `default`."""
        fam = dict(self.by_family)
        for key in (f"{family}:{policy}", family):
            if key in fam:
                return fam[key]
        return dict(self.by_policy).get(policy, self.default)

    def range_text(self) -> str:
        """The allowed values, as errors, --help and the docs say them."""
        if self.choices:
            return "one of " + ", ".join(f"'{c}'" for c in self.choices)
        if self.type == "bool":
            return "true or false"
        if self.lo is None and self.hi is None:
            return "finite" if self.type == "float" else ""
        num = _num_text
        if self.lo is not None and self.hi is not None:
            text = f"in {'(' if self.lo_open else '['}{num(self.lo)}, {num(self.hi)}{')' if self.hi_open else ']'}"
        elif self.lo is not None:
            text = f"{'>' if self.lo_open else '>='} {num(self.lo)}"
        else:
            assert self.hi is not None  # lo is None here, and both None returned above
            text = f"{'<' if self.hi_open else '<='} {num(self.hi)}"
        if self.type == "float" and (self.lo is None or self.hi is None):
            text += " and finite"
        return text


def _num_text(v: float) -> str:
    if isinstance(v, int) and v >= 1 << 20 and (v & (v - 1)) == 0:
        return f"2^{v.bit_length() - 1}"
    if isinstance(v, int) and v == (1 << 63) - 1:
        return "2^63 - 1"
    return f"{v:g}" if isinstance(v, float) else str(v)


MAX_BRANCHES = 16  # csrc/kernels/branches.h kMaxBranches (a static_assert compares)
MAX_GAP_TOKENS = 1 << 30  # sync_gap, refresh_tokens
MAX_ACTIVE_BLOCKS = 64  # wavefront: max_active_blocks (a step packs one query row per active block)
# DUET's cost gates (prefix length below which a block decodes densely). The prefix gate is measured
# (benchmarks/bench_duet.py, docs/benchmarks.md "DUET"): 2048, the shortest context where a sparse block step
# was clearly faster (1.7x at budget 256; 1.1-1.2x at 512-1024, within the shared machine's noise). The query
# gate, measured by the same benchmark: 4096, the shortest context where a pruned block step (ratio 0.5, 20 of
# 32 rows after layer 1) was faster in every run (1.2x; 1.0-1.35x at 2048, within noise below).
DUET_PREFIX_GATE = 2048
DUET_QUERY_GATE = 4096
MIN_PROB_FLOOR = 0.01  # the probability maps hold at most 1 / prob_floor + 1 entries per position

_FOLD, _SHARE = (  # two long docs
    "feed a refresh's rows of identical canvases once, the twins taking that row's logits and K/V "
    "(exact: the same tokens and counters, fewer query tokens; folded_rows / folded_tokens count them)",
    "every branch reads one copy of the prompt's K/V, written by the first row each refresh feeds (an "
    "approximation: exact refreshes give each branch its own); its KV pages are held once (ALGORITHMS.md 12)",
)
OPTIONS: tuple[Option, ...] = (
    Option(
        "policy",
        "str",
        "dual",
        "vanilla: a full forward per step; prefix / dual: Fast-dLLM's KV caches; "
        "blockbatch: several block-size branches in one batched forward; block: the block-causal families' "
        "decoder (LLaDA2.0 / 2.1, SDAR; exact block cache), the only policy of LLaDA2 and SDAR checkpoints; "
        "window: Window-Diffusion's pruned forwards (a few active positions over a gathered key window); "
        "wavefront: FlowBlock's gated wavefront (LLaDA2.1 with editing: up to max_active_blocks blocks in flight)",
        choices=POLICIES,
        cpp_enum="Policy",
        cpp_values=("kVanilla", "kPrefix", "kDual", "kBlockBatch", "kBlock", "kWindow", "kWavefront"),
    ),
    Option("gen_length", "int", 128, "tokens to generate (the diffusion canvas after the prompt)", lo=1),
    Option(
        "block_length",
        "int",
        32,
        "block size of the single-branch policies (divides gen_length) and of block / wavefront (blocks aligned at "
        "position 0)",
        policies=(*SINGLE_BRANCH, *BLOCK_CAUSAL),
        lo=1,
    ),
    Option(
        "steps",
        "int",
        None,
        "total steps of LLaDA's fixed schedule (a multiple of the number of blocks, "
        "<= gen_length); Dream vanilla: its number of steps (<= gen_length); block: steps per block "
        "(block_length // steps commits a step, the remainder first); window: its forwards (LLaDA's schedule "
        "over the whole generation, <= gen_length)",
        optional=True,
        none_doc="no fixed schedule (Dream vanilla and window: gen_length steps)",
        lo=0,
    ),
    Option(
        "threshold",
        "float",
        0.9,
        "commit every masked position whose confidence is >= this (block: > this, if at least the "
        "schedule's count are; the authors of LLaDA2 use 0.95, and 0.7 with edit_threshold 0.5)",
        optional=True,
        none_doc="the fixed schedule (with steps)",
        lo=0.0,
        lo_open=True,
        hi=1.0,
    ),
    Option(
        "factor",
        "float",
        None,
        "Fast-dLLM's factor rule instead of the threshold (wins over threshold)",
        policies=SINGLE_BRANCH,
        optional=True,
        none_doc="off",
        lo=0.0,
        lo_open=True,
    ),
    Option("temperature", "float", 0.0, "Gumbel-max sampling temperature (float64, seeded); 0: greedy", lo=0.0),
    Option("seed", "int", 0, "sampling seed (with temperature > 0)", lo=0, hi=(1 << 63) - 1),
    Option(
        "stop_on_eos",
        "bool",
        False,
        "stop once a completed block holds EOS (the text is cut at the first EOS either way)",
        by_policy=(("blockbatch", True),),
        by_family=(("dream", False),),
    ),
    Option(
        "alg",
        "str",
        "confidence",
        "vanilla: which masked positions a step commits first: the most probable "
        "(confidence), the largest top-1 minus top-2 probability (margin), the lowest entropy (entropy), or a "
        "seeded random choice (origin); LLaDA ranks by confidence only; window on Dream: entropy only (the "
        "authors' ranking)",
        policies=("vanilla", "window"),
        choices=("confidence", "margin", "entropy", "origin"),
        cpp_enum="Alg",
        cpp_values=("kConfidence", "kMargin", "kEntropy", "kOrigin"),
        by_family=(("dream", "entropy"),),
        group="dream",
    ),
    Option(
        "alg_temp",
        "float",
        0.0,
        "Dream vanilla and window: > 0 draws the positions to commit from softmax(confidence / "
        "alg_temp) (seeded) instead of taking the top ones",
        policies=("vanilla", "window"),
        lo=0.0,
        group="dream",
    ),
    Option(
        "eps",
        "float",
        1e-3,
        "Dream vanilla and window: the schedule's last time step (t runs from 1 down to eps over steps)",
        policies=("vanilla", "window"),
        lo=0.0,
        lo_open=True,
        hi=1.0,
        hi_open=True,
        group="dream",
    ),
    Option(
        "top_p",
        "float",
        None,
        "Dream vanilla / prefix / dual / window: propose only from the most probable tokens holding this much "
        "probability",
        policies=(*SINGLE_BRANCH, "window"),
        optional=True,
        none_doc="off",
        lo=0.0,
        lo_open=True,
        hi=1.0,
        group="dream",
    ),
    Option(
        "top_k",
        "int",
        None,
        "Dream vanilla / prefix / dual / window: propose only from the top_k most probable tokens",
        policies=(*SINGLE_BRANCH, "window"),
        optional=True,
        none_doc="off",
        lo=1,
        group="dream",
    ),
    Option(
        "block_sizes",
        "int[]",
        (4, 8, 16, 32, 64, 128),
        "blockbatch: one branch per block size; each divides "
        "gen_length, no repeats (unset: the family's default sizes that divide gen_length)",
        policies=("blockbatch",),
        lo=1,
        max_items=MAX_BRANCHES,
        by_family=(("dream", (4, 8, 16, 32, 64)),),
        group="blockbatch",
    ),
    Option(
        "merge_gate",
        "float",
        0.5,
        "merge a token into a branch when that branch's own probability of it exceeds this",
        policies=("blockbatch",),
        lo=0.0,
        lo_open=True,
        hi=1.0,
        group="blockbatch",
    ),
    Option(
        "sync_gap",
        "int",
        8,
        "copy the leader into a branch lagging by more than this many tokens",
        policies=("blockbatch",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="blockbatch",
    ),
    Option(
        "refresh_tokens",
        "int",
        32,
        "full-canvas KV refresh of a branch every this many decoded tokens (0: never)",
        policies=("blockbatch",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="blockbatch",
    ),
    Option(
        "refresh_mode",
        "str",
        "periodic",
        "periodic: refresh every refresh_tokens; divergence: only when the branches' distributions drift",
        policies=("blockbatch",),
        choices=("periodic", "divergence"),
        cpp_enum="RefreshMode",
        cpp_values=("kPeriodic", "kDivergence"),
        group="blockbatch",
    ),
    Option(
        "prob_floor",
        "float",
        0.1,
        "probabilities kept per position for merging (LLaDA: >= this; Dream: > this)",
        policies=("blockbatch",),
        lo=MIN_PROB_FLOOR,
        hi=1.0,
        hi_open=True,
        by_family=(("dream", 0.2),),
        group="blockbatch",
    ),
    Option(
        "merge",
        "bool",
        True,
        "confidence-gated merging (ablation switch)",
        policies=("blockbatch",),
        group="blockbatch",
    ),
    Option(
        "sync", "bool", True, "leader synchronisation (ablation switch)", policies=("blockbatch",), group="blockbatch"
    ),
    Option(
        "sync_refresh",
        "bool",
        False,
        "variant (not the authors'): refresh once a leader sync has copied a lagging "
        "branch, whose copied KV row predates the leader's last commits (ALGORITHMS.md 10.3)",
        policies=("blockbatch",),
        group="blockbatch",
    ),
    Option(
        "branch_budget",
        "str",
        "full",
        "full: every branch of block_sizes; auto: under the batching scheduler, "
        "the branch set is cut to the query tokens a step can carry at the current load (measured step-time "
        "curve; the largest branches go first, down to the one nearest block_length), so results depend on load",
        policies=("blockbatch",),
        choices=("full", "auto"),
        cpp_enum="BranchBudget",
        cpp_values=("kFull", "kAuto"),
        group="blockbatch",
    ),
    Option("fold_rows", "bool", True, _FOLD, policies=("blockbatch",), group="blockbatch"),
    Option("share_prompt_kv", "bool", False, _SHARE, policies=("blockbatch",), group="blockbatch"),
    Option(
        "edit_threshold",
        "float",
        None,
        "block (LLaDA2.1 token editing): in the same step, replace every generated committed token of the "
        "current block whose prediction differs with confidence above this (wavefront: required, in every active "
        "block)",
        policies=BLOCK_CAUSAL,
        optional=True,
        none_doc="no editing (LLaDA2.0)",
        lo=0.0,
        hi=1.0,
        group="llada2",
    ),
    Option(
        "max_post_steps",
        "int",
        16,
        "block with editing: a block ends after at most this many steps that start without masks (wavefront: "
        "the oldest active block commits then)",
        policies=BLOCK_CAUSAL,
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="llada2",
    ),
    Option(
        "max_active_blocks",
        "int",
        2,
        "wavefront: blocks in flight at most (the oldest and the drafts after it, each step one forward over "
        "all of them); 1: the block policy with editing",
        policies=("wavefront",),
        lo=1,
        hi=MAX_ACTIVE_BLOCKS,
        group="wavefront",
    ),
    Option(
        "spawn_threshold",
        "float",
        0.5,
        "wavefront: a new block enters the window once this fraction of the youngest active block's generated "
        "positions is decoded (0: the window fills at once; 1: once the youngest has no masks)",
        policies=("wavefront",),
        lo=0.0,
        hi=1.0,
        group="wavefront",
    ),
    Option(
        "window_tokens",
        "int",
        64,
        "window: masked positions, beyond the decoded ones, kept as keys during a phase (the first ones; "
        "on Dream, the authors' o_win_size minus one)",
        policies=("window",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        by_family=(("dream", 127),),
        group="window",
    ),
    Option(
        "active_tokens",
        "int",
        16,
        "window: masked positions a pruned step computes (the first ones, with the phase's own commits)",
        policies=("window",),
        lo=1,
        hi=MAX_GAP_TOKENS,
        group="window",
    ),
    Option(
        "refresh_interval",
        "int",
        32,
        "window: steps per phase (a full forward every this many steps, the others pruned)",
        policies=("window",),
        lo=1,
        hi=MAX_GAP_TOKENS,
        group="window",
    ),
    Option(
        "slide_window",
        "bool",
        False,
        "window, Dream: inside a phase the active span's end follows the first active_tokens masks (its start stays "
        "at the phase's first mask; else the whole span is frozen)",
        policies=("window",),
        by_family=(("dream", True),),
        group="window",
    ),
    Option(
        "early_stop",
        "bool",
        False,
        "window, Dream (the authors' flag, not stop_on_eos): one token per pruned step, the canvas cut "
        "after the first EOS, every step after it a full one",
        policies=("window",),
        group="window",
    ),
    Option(
        "unmasking",
        "str",
        None,
        "block on SDAR checkpoints: which masked positions a step commits (n: the step's share of block_length "
        "over steps): dynamic: those rated > threshold, at least the top n; static: the top n; sequential: the n "
        "leftmost; entropy_bounded: the k leftmost, k the multiples of the block's summed entropy below "
        "entropy_bound",
        policies=("block",),
        optional=True,
        none_doc="the family's rule (SDAR: dynamic; LLaDA2 has only its own and refuses this option)",
        choices=("dynamic", "static", "sequential", "entropy_bounded"),
        cpp_enum="Unmasking",
        cpp_values=("kDynamic", "kStatic", "kSequential", "kEntropyBounded"),
        group="sdar",
    ),
    Option(
        "entropy_bound",
        "float",
        0.35,
        "block on SDAR, unmasking entropy_bounded: the bound on the running sums of the block's entropy "
        "(the authors' CLI default 0.35)",
        policies=("block",),
        lo=0.0,
        lo_open=True,
        group="sdar",
    ),
    Option(
        "prefix_kv_budget",
        "int",
        0,
        "block (DUET, ALGORITHMS.md 18.1): prefix keys each layer attends after a block's first step, selected "
        "there by Raw-L1 distance to the block's queries (0: every prefix key, dense)",
        policies=("block",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="block",
    ),
    Option(
        "prefix_kv_min_context",
        "int",
        DUET_PREFIX_GATE,
        "block, prefix_kv_budget > 0: the cost gate; a block whose prefix is shorter decodes densely",
        policies=("block",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="block",
    ),
    Option(
        "query_keep_ratio",
        "float",
        1.0,
        "block (DUET, ALGORITHMS.md 18.2): after query_select_layer, only ceil(ratio x masks) masked rows (the "
        "most confident at that layer) and the decided rows run the deeper layers (1.0: every row, dense)",
        policies=("block",),
        lo=0.0,
        lo_open=True,
        hi=1.0,
        group="block",
    ),
    Option(
        "query_select_layer",
        "int",
        None,
        "block, query_keep_ratio < 1: the layer after which the block's rows are ranked (the LM head on its "
        "hidden state) and pruned",
        policies=("block",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        by_family=(("llada2", 1), ("sdar", 5)),
        group="block",
    ),
    Option(
        "query_reuse_interval",
        "int",
        4,
        "block, query_keep_ratio < 1: a row selection is reused for this many steps while enough of its masks "
        "remain (1: ranked every step)",
        policies=("block",),
        lo=1,
        hi=MAX_GAP_TOKENS,
        group="block",
    ),
    Option(
        "query_dense_masks",
        "int",
        4,
        "block, query_keep_ratio < 1: a step with at most this many masks in its block runs every row",
        policies=("block",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="block",
    ),
    Option(
        "query_min_context",
        "int",
        DUET_QUERY_GATE,
        "block, query_keep_ratio < 1: the cost gate; a block whose prefix is shorter decodes densely",
        policies=("block",),
        lo=0,
        hi=MAX_GAP_TOKENS,
        group="block",
    ),
    Option(
        "cuda_graphs",
        "bool",
        True,
        "CUDA: replay recorded decode steps (same tokens as eager); no effect on CPU",
        group="runtime",
    ),
    Option(
        "timeout_s",
        "float",
        0.0,
        "fail with a timeout once a decode runs longer than this many seconds (0: no deadline)",
        lo=0.0,
        group="runtime",
    ),
    Option(
        "logprobs",
        "int",
        None,
        "record, per generated token, the log-probability the model gave it in the forward that committed (or "
        "last edited) it (float32 log_softmax of the raw logits row the commit read: before temperature, top_p, "
        "top_k) and this many top alternatives from the same row (0..20); not a left-to-right likelihood",
        optional=True,
        none_doc="off",
        lo=0,
        hi=20,
        group="runtime",
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
# The default of every option as DecodeOptions holds it: None for the ones resolved per policy /
# family (see Option.default_for).
DEFAULTS: dict[str, Any] = {o.name: (None if o.resolved_by_table else o.default) for o in OPTIONS}


def defaults_for(policy: str, family: str = FAMILIES[0]) -> dict[str, Any]:
    """Every option's default for one policy and family, nothing left to resolve (the reference
    decoders' keyword defaults)."""
    return {o.name: o.default_for(policy, family) for o in OPTIONS}


# --------------------------------------------------------------------------- statistics and error kinds


@dataclasses.dataclass(frozen=True)
class Stat:
    """One entry of a decode's statistics (``DecodeOutput.stats``)."""

    name: str
    type: str  # "int" | "float" | "bool" | "int[]" | "float[]" | "str" | "branches"
    doc: str  # one line
    cpp: str = ""  # the C++ expression over `const DecodeStats& s` of a scalar counter ("": filled in Python)


# The scalar counters the native decoders fill (csrc/decode/options.h DecodeStats), in the order the
# decode ops return them, then what Python adds from the per-forward log, the branch table and the
# options. From this table: decode_stat_names / decode_stat_values (csrc/decode/options_table.cpp)
# and the ``DecodeStats`` TypedDict of ``options_fields.py`` (the type of ``DecodeOutput.stats``).
STATS: tuple[Stat, ...] = (
    Stat("nfe", "int", "forwards executed (a batched forward of several branches is one)", "s.nfe"),
    Stat("nfe_full", "int", "full-canvas forwards (single-branch block starts, vanilla steps)", "s.nfe_full"),
    Stat("nfe_block", "int", "cached block forwards", "s.nfe_block"),
    Stat("nfe_init", "int", "BlockBatch's init forward", "s.nfe_init"),
    Stat("nfe_refresh", "int", "BlockBatch's full-sequence refresh forwards", "s.nfe_refresh"),
    Stat("nfe_paper", "int", "the paper's accounting: the winning branch's participation count", "s.nfe_paper"),
    Stat("winner", "int", "index of the returned branch (block sizes sorted)", "s.winner"),
    Stat("winner_block_size", "int", "block size of the returned branch", "s.winner_block_size"),
    Stat("early_exit", "bool", "the decode ended at an EOS before the canvas was full", "s.early_exit"),
    Stat("wall_ms", "float", "wall time of the decode in milliseconds", "s.wall_ms"),
    Stat("steps", "int", "forwards logged (one entry per forward in the per-step lists)", "s.steps.size()"),
    Stat("graph_captures", "int", "CUDA graphs recorded (0 on the CPU or with cuda_graphs off)", "s.graph_captures"),
    Stat("graph_replays", "int", "CUDA graph replays", "s.graph_replays"),
    Stat("edits", "int", "policy block with edit_threshold, wavefront: committed tokens replaced", "s.edits"),
    Stat(
        "folded_rows",
        "int",
        "BlockBatch fold_rows: refresh rows not fed (twins of an identical canvas)",
        "s.folded_rows",
    ),
    Stat("folded_tokens", "int", "the query tokens of those rows", "s.folded_tokens"),
    Stat(
        "prefix_cache_hit_tokens",
        "int",
        "prompt positions whose K/V came from the prefix cache",
        "s.prefix_cache_hit_tokens",
    ),
    Stat("kv_pages_copied", "int", "BlockBatch over paged rows: KV pages copied on write", "s.kv_pages_copied"),
    Stat("nfe_pruned", "int", "window: pruned forwards (active positions over the phase's key window)", "s.nfe_pruned"),
    Stat(
        "pruned_key_tokens",
        "int",
        "window: keys the pruned forwards attended, summed over them (a window each)",
        "s.pruned_key_tokens",
    ),
    Stat(
        "nfe_prefill",
        "int",
        "block on SDAR: the authors' prefill forward (1 when the prompt holds a complete block)",
        "s.nfe_prefill",
    ),
    Stat("nfe_store", "int", "block on SDAR: the authors' store forwards (one per decoded block)", "s.nfe_store"),
    Stat(
        "blocks_in_flight",
        "int",
        "wavefront: active blocks summed over the forwards (divided by nfe: the mean window)",
        "s.blocks_in_flight",
    ),
    Stat("max_blocks_in_flight", "int", "wavefront: the most blocks one forward ran", "s.max_blocks_in_flight"),
    Stat(
        "redrafted_tokens",
        "int",
        "wavefront: edits of tokens drafted while an older block was still in flight (repairs of stale drafts)",
        "s.redrafted_tokens",
    ),
    Stat(
        "prefix_keys_selected",
        "int",
        "block, prefix_kv_budget: selected prefix keys summed over the layers and the block steps that read them",
        "s.prefix_keys_selected",
    ),
    Stat(
        "query_rows_dropped",
        "int",
        "block, query_keep_ratio: block rows dropped after query_select_layer, summed over the steps",
        "s.query_rows_dropped",
    ),
    Stat("committed_per_step", "int[]", "tokens committed by each forward"),
    Stat("query_tokens_per_step", "int[]", "query tokens of each forward (packed over branches)"),
    Stat(
        "key_tokens_per_step",
        "int[]",
        "keys each forward attended, summed over its rows (a full forward: its own tokens; a cached one: the "
        "cache rows it reads)",
    ),
    Stat(
        "blocks_per_step",
        "int[]",
        "wavefront: blocks in flight in each forward (its active window, 1..max_active_blocks); empty for every "
        "other policy",
    ),
    Stat("branches", "branches", "per branch: block_size, committed, merged, copied, forwards"),
    Stat("policy", "str", "the policy that decoded"),
)
STAT_NAMES = tuple(s.name for s in STATS)
NATIVE_STATS = tuple(s for s in STATS if s.cpp)  # the scalar counters, in the ops' order
BRANCH_FIELDS = ("block_size", "committed", "merged", "copied", "forwards")  # csrc/decode/options.h BranchStats


@dataclasses.dataclass(frozen=True)
class ErrorKind:
    """Why a request was refused or did not finish: ``RequestError.kind`` and ``Event.error_kind``."""

    name: str
    status: int  # the HTTP status the server answers with
    doc: str  # one line


# From this table: enum class ErrorKind and error_kind_name (csrc/decode/options_table.h / .cpp).
ERROR_KINDS: tuple[ErrorKind, ...] = (
    ErrorKind("invalid_option", 400, "an option is out of its range or malformed (param: the option)"),
    ErrorKind("unsupported", 400, "the options cannot decode on this model or policy (param: the option to change)"),
    ErrorKind("invalid_prompt", 400, "the prompt is empty or holds an id outside the vocabulary or the mask id"),
    ErrorKind("context_length", 413, "prompt plus gen_length do not fit the model's or the server's length"),
    ErrorKind("kv_budget", 400, "the request needs more KV rows or pages than the pool holds"),
    ErrorKind("timeout", 504, "the decode ran past its timeout_s"),
    ErrorKind("cancelled", 503, "the request was cancelled before it finished"),
    ErrorKind("decode_failed", 500, "the decode failed (an internal error)"),
)
ERROR_KIND_NAMES = tuple(k.name for k in ERROR_KINDS)


# --------------------------------------------------------------------------- Python-side types


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_TYPE_CHECKS = {
    "int": (_is_int, "an integer"),
    "float": (_is_real, "a number"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "int[]": (lambda v: isinstance(v, (list, tuple)) and all(_is_int(b) for b in v), "a list or tuple of integers"),
}


class OptionTypeError(TypeError):
    """An option's value of the wrong type; ``param`` is the option's name."""

    kind = "invalid_option"

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_type(name: str, value: Any) -> None:
    """OptionTypeError (a TypeError) naming the option when `value` is not of its type (None where
    the option allows it)."""
    o = BY_NAME[name]
    if value is None and (o.optional or o.resolved_by_table):
        return
    ok, what = _TYPE_CHECKS[o.type]
    if not ok(value):
        what += " or None" if o.optional or o.resolved_by_table else ""
        raise OptionTypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}", name)


def parse_text(name: str, text: str, list_sep: str = ",") -> Any:
    """An option's value from command-line text ('none' for None where allowed); ValueError naming it."""
    o = BY_NAME[name]
    t = text.strip()
    if t.lower() == "none" and (o.optional or o.resolved_by_table):
        return None
    try:
        if o.type == "int":
            return int(t)
        if o.type == "float":
            return float(t)
        if o.type == "bool":
            if t.lower() in ("1", "true", "yes", "on"):
                return True
            if t.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if o.type == "int[]":
            return tuple(int(x) for x in t.split(list_sep) if x.strip())
        if o.choices and t not in o.choices:
            raise ValueError
        return t
    except ValueError:
        expected = {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "int[]": f"integers separated by '{list_sep}'",
        }.get(o.type, o.range_text())
        extra = " or 'none'" if o.optional or o.resolved_by_table else ""
        raise ValueError(f"{name}: expected {expected}{extra}, got {text!r}") from None


def to_op_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of torch.ops.blockbatch.decode / options for option values."""
    out = {}
    for name in NAMES:
        v = values[name]
        o = BY_NAME[name]
        if v is not None and o.type == "float":
            v = float(v)
        elif o.type == "int[]" and v is not None:
            v = [int(b) for b in v]
        out[name] = v
    return out


# --------------------------------------------------------------------------- command line


def cli_help(o: Option) -> str:
    parts = [o.doc]
    r = o.range_text()
    if o.max_items:
        r = f"up to {o.max_items} entries, each {r}"
    if r and not o.choices and o.type != "bool":
        parts.append(r)
    default = f"default {value_text(o.default)}"
    if o.by_policy:
        default += "; " + ", ".join(f"{p}: {value_text(v)}" for p, v in o.by_policy)
    if o.by_family:
        default += "; " + ", ".join(f"{f} models: {value_text(v)}" for f, v in o.by_family)
    parts.append(default)
    if o.optional:
        parts.append(f"'none': {o.none_doc}")
    return "; ".join(parts)


def value_text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    return str(v)
