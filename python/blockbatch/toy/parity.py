"""A second toy task, another skill than the arithmetic: running parity over a bit string.

A problem is ``k`` (8..16) bits; the prompt is the bits in fixed 16-character slots (unused slots
are dots) and a final ``?``; the response is the running XOR of the bits (the i-th character is
the parity of the first i + 1 bits), then ``;`` and the parity of all of them::

    prompt:    "10110.........?"  (k = 5 shown; always 17 characters)
    response:  "11011;1"

Each response character sits exactly ``PROMPT_CHARS`` tokens after the bit it folds in and one
after the previous parity: given its predecessor, a character is one XOR of two tokens at fixed
distances (what a small RoPE model learns), but with its predecessor still masked it depends on
every earlier bit. So a threshold decoder can only commit the chain front to back, a few
characters per step at best: long sequential dependencies, unlike the arithmetic's short chains
whose format is certain long before the digits. ``check_answer`` compares the whole response
(every running parity and the final one): a coin flip on the last bit is not an answer.

The module has ``blockbatch.toy.task``'s interface (``make_problems``, ``iter_problems``,
``check_answer``, ``PROMPT_CHARS``, ``MAX_RESPONSE_CHARS``), which ``tools/train_toy.py --task
parity`` trains on. Splits are by a hash of the prompt, as there (``task.split_of``).
"""

from __future__ import annotations

import dataclasses
import random

from .task import split_stream, take

MIN_BITS, MAX_BITS = 8, 16
UNUSED = "."
PROMPT_END = "?"
ANSWER_SEP = ";"
PROMPT_CHARS = MAX_BITS + 1
MAX_RESPONSE_CHARS = MAX_BITS + 2


@dataclasses.dataclass(frozen=True)
class Problem:
    bits: tuple[int, ...]

    @property
    def prompt(self) -> str:
        return "".join(map(str, self.bits)) + UNUSED * (MAX_BITS - len(self.bits)) + PROMPT_END

    @property
    def values(self) -> list[int]:
        """The running parities."""
        out, p = [], 0
        for b in self.bits:
            p ^= b
            out.append(p)
        return out

    @property
    def answer(self) -> str:
        return self.response  # the whole trace is checked

    @property
    def response(self) -> str:
        v = self.values
        return "".join(map(str, v)) + ANSWER_SEP + str(v[-1])


def random_problem(rng: random.Random, min_bits: int = MIN_BITS, max_bits: int = MAX_BITS) -> Problem:
    k = rng.randint(min_bits, max_bits)
    return Problem(tuple(rng.randint(0, 1) for _ in range(k)))


def iter_problems(seed: int, split: str, min_bits: int = MIN_BITS, max_bits: int = MAX_BITS):
    """Endless deterministic stream of problems of one split (duplicates possible)."""
    return split_stream("blockbatch-toy-parity", seed, split, lambda rng: random_problem(rng, min_bits, max_bits))


def make_problems(n: int, seed: int = 0, split: str = "test", unique: bool = True) -> list[Problem]:
    """``n`` problems of ``split``, deterministic in ``seed``; with ``unique`` no prompt repeats."""
    return take(iter_problems(seed, split), n, unique)


def check_answer(problem: Problem, generated_text: str) -> bool:
    """True iff the generated response is exactly the reference one (every running parity)."""
    return generated_text.strip() == problem.response
