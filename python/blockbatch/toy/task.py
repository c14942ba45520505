"""The toy task: a chain of small additions and subtractions, filled in step by step.

A problem starts from a two-digit number and applies ``k`` (2..6) operations ``+d`` / ``-d``
with ``d`` in 1..3, chosen so that every running value stays in 10..99. The prompt is the chain
with a blank ``__`` for each running total, in fixed 5-character slots (unused slots are dots)
and a final ``?``; the response writes the chain again with the blanks filled in, then ``;``
and the answer::

    prompt:    "37+2=__-3=__+1=__...............?"   (always 33 characters)
    response:  "37+2=39-3=36+1=37;37"

The answer is checked exactly (``check_answer``); ``check_trace`` also checks every step.

Why this layout: the model is a bidirectional transformer with RoPE, which finds "the token at
a fixed distance" easily but has no notion of absolute position. Every prompt has the same
length, so each response character sits exactly ``PROMPT_CHARS`` tokens after the prompt
character it copies or fills in, and each total needs only its own operand (3-4 tokens back)
and the previous total (5 tokens back): the task is fixed-offset copying plus two-digit
arithmetic, which a ~1M-parameter model learns in minutes on a CPU. Two choices were forced by
that budget: with free-form prompts a model that size does not learn to find the j-th operand,
and with operands up to 9 it stays stuck on the units digit (``(u + d) mod 10`` is independent
of ``u`` alone, so there is no first-order signal to follow); with ``d <= 3`` the new units
digit stays close to the old one and the table is learned in about a thousand steps.

The layout of the response (where each operand, ``=``, ``;`` and EOS goes) follows from the
prompt alone, while each total depends on all the earlier ones: a small model is sure of the
format long before it is sure of the digits, so threshold decoding commits the format first
and the digits over several steps.

Problems are assigned to the train or test split by a hash of their prompt, so the splits are
disjoint whatever seeds are used; ``make_problems(n, seed, split)`` is deterministic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from typing import Any, Callable, Iterable, Iterator

MIN_OPS, MAX_OPS = 2, 6
MIN_VALUE, MAX_VALUE = 10, 99
MAX_DIGIT = 3  # operations are +d / -d with d in 1..MAX_DIGIT
TEST_FRACTION_PER_MILLE = 100  # ~10% of all possible prompts belong to the test split
SPLITS = ("train", "test")
SLOT = 5  # characters per step: sign, digit, "=", two digits of the total
BLANK = "__"
UNUSED = "."
PROMPT_END = "?"
ANSWER_SEP = ";"

PROMPT_CHARS = 2 + SLOT * MAX_OPS + 1
MAX_RESPONSE_CHARS = 2 + SLOT * MAX_OPS + 1 + 2


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem: ``start`` then ``ops`` (signed digits, e.g. ``(5, -8, 6)``)."""

    start: int
    ops: tuple[int, ...]

    @property
    def expression(self) -> str:
        """``"37+5-8+6"``: the problem in plain notation (not what the model sees)."""
        return str(self.start) + "".join(f"{'+' if d > 0 else '-'}{abs(d)}" for d in self.ops)

    def _chain(self, totals: list[str]) -> str:
        return str(self.start) + "".join(f"{'+' if d > 0 else '-'}{abs(d)}={t}" for d, t in zip(self.ops, totals))

    @property
    def prompt(self) -> str:
        unused = UNUSED * (SLOT * (MAX_OPS - len(self.ops)))
        return self._chain([BLANK] * len(self.ops)) + unused + PROMPT_END

    @property
    def values(self) -> list[int]:
        """Running values after each operation."""
        out, v = [], self.start
        for d in self.ops:
            v += d
            out.append(v)
        return out

    @property
    def answer(self) -> int:
        return self.start + sum(self.ops)

    @property
    def response(self) -> str:
        return self._chain([str(v) for v in self.values]) + ANSWER_SEP + str(self.answer)


RESPONSE_KINDS = ("format", "copied_digit", "total_digit", "answer_digit")


def response_kinds(problem: Problem) -> list[str]:
    """Kind of each reference response character: ``format`` (signs, ``=``, ``;``),
    ``copied_digit`` (the start value and the operands, repeated from the prompt),
    ``total_digit`` (the running totals filled into the blanks) or ``answer_digit``."""
    kinds = ["copied_digit", "copied_digit"]
    for _ in problem.ops:
        kinds += ["format", "copied_digit", "format", "total_digit", "total_digit"]
    kinds.append("format")
    kinds += ["answer_digit"] * len(str(problem.answer))
    assert len(kinds) == len(problem.response)
    return kinds


def split_of(problem) -> str:
    """``"test"`` for ~10% of prompts (chosen by a hash of the prompt text), else ``"train"``: any
    toy task's problem (one with a ``prompt``)."""
    h = int.from_bytes(hashlib.sha256(problem.prompt.encode()).digest()[:4], "little")
    return "test" if h % 1000 < TEST_FRACTION_PER_MILLE else "train"


def split_stream(tag: str, seed: int, split: str, draw: Callable[[random.Random], Any]) -> Iterator[Any]:
    """Endless deterministic stream of the problems ``draw`` makes, those of one split (duplicates
    possible), from the generator seeded ``"{tag}:{split}:{seed}"``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{tag}:{split}:{seed}")
    while True:
        p = draw(rng)
        if split_of(p) == split:
            yield p


def take(problems: Iterable[Any], n: int, unique: bool = True) -> list[Any]:
    """The first ``n`` of ``problems``; with ``unique`` no prompt repeats."""
    out: list[Any] = []
    seen: set[str] = set()
    for p in problems:
        if len(out) >= n:
            break
        if unique:
            if p.prompt in seen:
                continue
            seen.add(p.prompt)
        out.append(p)
    return out


def random_problem(rng: random.Random, min_ops: int = MIN_OPS, max_ops: int = MAX_OPS) -> Problem:
    """A uniformly random valid problem (any split)."""
    k = rng.randint(min_ops, max_ops)
    start = rng.randint(MIN_VALUE, MAX_VALUE)
    v, ops = start, []
    for _ in range(k):
        signs = [s for s in (1, -1) if MIN_VALUE <= v + s <= MAX_VALUE]
        sign = rng.choice(signs)
        digits = [d for d in range(1, MAX_DIGIT + 1) if MIN_VALUE <= v + sign * d <= MAX_VALUE]
        d = sign * rng.choice(digits)
        ops.append(d)
        v += d
    return Problem(start, tuple(ops))


def iter_problems(seed: int, split: str, min_ops: int = MIN_OPS, max_ops: int = MAX_OPS):
    """Endless deterministic stream of problems of one split (duplicates possible)."""
    return split_stream("blockbatch-toy", seed, split, lambda rng: random_problem(rng, min_ops, max_ops))


def make_problems(
    n: int, seed: int = 0, split: str = "test", unique: bool = True, min_ops: int = MIN_OPS, max_ops: int = MAX_OPS
) -> list[Problem]:
    """``n`` problems of ``split`` ("train" or "test"), deterministic in ``seed``.

    With ``unique`` no prompt repeats. Train and test problems never share a prompt.
    """
    return take(iter_problems(seed, split, min_ops, max_ops), n, unique)


_ANSWER_RE = re.compile(r";(\d+)\s*$")


def parse_answer(generated_text: str) -> int | None:
    """The integer after the final ``;`` of a generated response, or None if it is malformed.

    The text must end right after the answer digits (trailing whitespace allowed): a response
    that rambles on after its answer is not accepted.
    """
    m = _ANSWER_RE.search(generated_text)
    return int(m.group(1)) if m else None


def check_answer(problem: Problem, generated_text: str) -> bool:
    """True iff the generated response ends in ``;<answer>`` with the correct answer.

    ``generated_text`` is the decoded response (special tokens removed, cut at the first EOS).
    The steps before the answer are not checked: see ``check_trace`` for that.
    """
    got = parse_answer(generated_text)
    return got is not None and got == problem.answer


def check_trace(problem: Problem, generated_text: str) -> bool:
    """True iff the whole response, trace and answer, is exactly the reference one."""
    return generated_text.strip() == problem.response
