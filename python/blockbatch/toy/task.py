"""The toy task: a chain of single-digit additions and subtractions, solved step by step.

A problem starts from a two-digit number and applies ``k`` (2..6) operations ``+d`` / ``-d``
with ``d`` in 1..9, chosen so that every running value stays in 10..99. The prompt is the
expression; the response writes one step per operation and then the answer::

    prompt:    37+5-8+6=
    response:  37+5=42,42-8=34,34+6=40;40

Every running value has two digits, so the layout of the response (where each operand, sign,
``=``, ``,`` and ``;`` goes) is fixed by the prompt alone, while the result digits have to be
computed, and a result deep in the chain depends on all the earlier ones. A small model is
therefore sure of the format and of the copied operands long before it is sure of the digits,
which is what makes threshold decoding take several steps.

Problems are assigned to the train or test split by a hash of their prompt, so the splits are
disjoint whatever seeds are used; ``make_problems(n, seed, split)`` is deterministic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re

MIN_OPS, MAX_OPS = 2, 6
MIN_VALUE, MAX_VALUE = 10, 99
TEST_FRACTION_PER_MILLE = 100  # ~10% of all possible prompts belong to the test split
SPLITS = ("train", "test")
ANSWER_SEP = ";"
STEP_SEP = ","

# Longest response: MAX_OPS steps of "ab+c=de" plus separators and ";de".
MAX_RESPONSE_CHARS = MAX_OPS * 7 + (MAX_OPS - 1) + 3
MAX_PROMPT_CHARS = 2 + 2 * MAX_OPS + 1


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem: ``start`` then ``ops`` (signed digits, e.g. ``(5, -8, 6)``)."""

    start: int
    ops: tuple[int, ...]

    @property
    def prompt(self) -> str:
        return str(self.start) + "".join(f"{'+' if d > 0 else '-'}{abs(d)}" for d in self.ops) + "="

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
        steps, v = [], self.start
        for d in self.ops:
            nv = v + d
            steps.append(f"{v}{'+' if d > 0 else '-'}{abs(d)}={nv}")
            v = nv
        return STEP_SEP.join(steps) + ANSWER_SEP + str(v)


def split_of(problem: Problem) -> str:
    """``"test"`` for ~10% of prompts (chosen by a hash of the prompt text), else ``"train"``."""
    h = int.from_bytes(hashlib.sha256(problem.prompt.encode()).digest()[:4], "little")
    return "test" if h % 1000 < TEST_FRACTION_PER_MILLE else "train"


def random_problem(rng: random.Random, min_ops: int = MIN_OPS, max_ops: int = MAX_OPS) -> Problem:
    """A uniformly random valid problem (any split)."""
    k = rng.randint(min_ops, max_ops)
    start = rng.randint(MIN_VALUE, MAX_VALUE)
    v, ops = start, []
    for _ in range(k):
        signs = [s for s in (1, -1) if MIN_VALUE <= v + s <= MAX_VALUE]
        sign = rng.choice(signs)
        digits = [d for d in range(1, 10) if MIN_VALUE <= v + sign * d <= MAX_VALUE]
        d = sign * rng.choice(digits)
        ops.append(d)
        v += d
    return Problem(start, tuple(ops))


def iter_problems(seed: int, split: str, min_ops: int = MIN_OPS, max_ops: int = MAX_OPS):
    """Endless deterministic stream of problems of one split (duplicates possible)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"blockbatch-toy:{split}:{seed}")
    while True:
        p = random_problem(rng, min_ops, max_ops)
        if split_of(p) == split:
            yield p


def make_problems(n: int, seed: int = 0, split: str = "test", unique: bool = True,
                  min_ops: int = MIN_OPS, max_ops: int = MAX_OPS) -> list[Problem]:
    """``n`` problems of ``split`` ("train" or "test"), deterministic in ``seed``.

    With ``unique`` no prompt repeats. Train and test problems never share a prompt.
    """
    out: list[Problem] = []
    seen: set[str] = set()
    for p in iter_problems(seed, split, min_ops, max_ops):
        if len(out) >= n:
            break
        if unique:
            if p.prompt in seen:
                continue
            seen.add(p.prompt)
        out.append(p)
    return out


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
