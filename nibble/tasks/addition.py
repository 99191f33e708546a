"""Multi-digit addition: prompt ``"123+45="``, answer ``"168"``; the default task.

Difficulty is the operand length ``digits`` (2–6 is the useful range for a few-million-parameter
model); ``mixed_lengths`` draws each operand's length uniformly from 1..``digits`` instead.

The held-out split is decided by a hash of the unordered operand pair, independent of every option but
``holdout_fraction``: a pair that is held out is held out at every difficulty, in both orders, so no
training stream — of any seed or digit count — ever shows an evaluation problem or its mirror.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator

from nibble.tasks.base import Example, Task, check_int
from nibble.tasks.tokenizers import CharTokenizer, Tokenizer

ALPHABET = "0123456789+="
MAX_DIGITS = 30
EVAL_DRAWS_PER_EXAMPLE = 20  # give up finding held-out problems after this many draws per wanted one


class AdditionTask(Task):
    """Addition of two non-negative integers of ``digits`` digits (no leading zeros).

    Args:
        digits: operand length, 1..30.
        mixed_lengths: draw each operand's length uniformly from 1..``digits``.
        eval_size: number of held-out problems (distinct ordered pairs).
        holdout_fraction: share of operand pairs reserved for evaluation, in (0, 0.5].
        partial_credit: reward scale of the shaped credit for a wrong all-digit answer: that scale times
            the fraction of right-aligned digit positions that match; 0 (the default) turns it off.
        tokenizer: defaults to a ``CharTokenizer`` over digits, ``+`` and ``=``.

    Raises:
        ValueError: naming the option that is out of range, or ``eval_size`` when the held-out part of
            the problem space is too small to hold that many problems.
    """

    name = "addition"

    def __init__(
        self,
        digits: int = 3,
        *,
        mixed_lengths: bool = False,
        eval_size: int = 256,
        holdout_fraction: float = 0.05,
        partial_credit: float = 0.0,
        tokenizer: Tokenizer | None = None,
    ):
        check_int("digits", digits, 1, MAX_DIGITS)
        check_int("eval_size", eval_size, 1, None)
        if not 0.0 < holdout_fraction <= 0.5:
            raise ValueError(f"holdout_fraction={holdout_fraction!r} must lie in (0, 0.5]")
        if not 0.0 <= partial_credit < 1.0:
            raise ValueError(f"partial_credit={partial_credit!r} must lie in [0, 1) (an exact answer earns 1)")
        super().__init__(tokenizer if tokenizer is not None else CharTokenizer(ALPHABET))
        self.digits = digits
        self.mixed_lengths = mixed_lengths
        self.eval_size = eval_size
        self.holdout_fraction = holdout_fraction
        self.partial_credit = partial_credit
        self.max_response_tokens = digits + 2  # a carry digit and eos
        self._eval: list[Example] | None = None

    def is_held_out(self, a: int, b: int) -> bool:
        """Whether the pair ``a + b`` (in either order) belongs to the evaluation split."""
        key = f"{min(a, b)}+{max(a, b)}".encode()
        bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        return bucket < self.holdout_fraction * 2**64

    def train_stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(f"addition/train/{seed}")
        while True:
            a, b = self._operand(rng), self._operand(rng)
            if not self.is_held_out(a, b):
                yield _example(a, b)

    def eval_examples(self) -> list[Example]:
        if self._eval is None:
            self._eval = self._draw_eval()
        return list(self._eval)

    def _draw_eval(self) -> list[Example]:
        rng = random.Random(self._eval_seed())
        pairs: dict[tuple[int, int], None] = {}  # insertion-ordered set
        for _ in range(EVAL_DRAWS_PER_EXAMPLE * int(self.eval_size / self.holdout_fraction)):
            a, b = self._operand(rng), self._operand(rng)
            if self.is_held_out(a, b):
                pairs[a, b] = None
                if len(pairs) == self.eval_size:
                    return [_example(a, b) for a, b in pairs]
        raise ValueError(
            f"eval_size={self.eval_size} is more than the held-out problems found at digits={self.digits} "
            f"(found {len(pairs)}); lower eval_size or raise digits or holdout_fraction"
        )

    def _eval_seed(self) -> str:
        return f"addition/eval/{self.digits}/{self.mixed_lengths}"

    def _operand(self, rng: random.Random) -> int:
        length = self._length(rng)
        return rng.randint(0 if length == 1 else 10 ** (length - 1), 10**length - 1)

    def _length(self, rng: random.Random) -> int:
        """One operand's number of digits."""
        return rng.randint(1, self.digits) if self.mixed_lengths else self.digits

    def reward(self, example: Example, response: str) -> float:
        """1.0 for exactly the answer (surrounding whitespace ignored), else the partial credit or 0.0."""
        response = response.strip()
        if response == example.answer:
            return 1.0
        if not self.partial_credit or not (response.isascii() and response.isdigit()):
            return 0.0
        matches = sum(x == y for x, y in zip(reversed(response), reversed(example.answer), strict=False))
        return self.partial_credit * matches / max(len(response), len(example.answer))


class HeavyTailAdditionTask(AdditionTask):
    """Addition whose operand lengths follow a power law, so response lengths are heavy-tailed.

    Each operand's length ``L`` in 1..``digits`` is drawn with ``P(L = l) ∝ l^-(1 + tail)`` (a discrete
    Pareto law truncated at ``digits``; ``P(L ≥ l)`` falls like ``l^-tail``). Most answers are a few
    digits long and a few run to ``digits + 1``: a batch of responses waits on its longest, which is
    what asynchronous RL hides and synchronous RL cannot (``benchmarks/async_speedup.py``). With the
    defaults the mean answer is ≈ 3.7 digits long and the median 2, while one in ≈ 17 has 12 or more.

    Args:
        digits: longest operand, 1..30.
        tail: the power law's index (> 0); smaller is heavier.
        eval_size, holdout_fraction, partial_credit, tokenizer: as for :class:`AdditionTask` (the
            held-out operand pairs are the same ones).

    Raises:
        ValueError: naming the option that is out of range.
    """

    name = "addition_heavy_tail"

    def __init__(
        self,
        digits: int = 24,
        *,
        tail: float = 1.0,
        eval_size: int = 256,
        holdout_fraction: float = 0.05,
        partial_credit: float = 0.0,
        tokenizer: Tokenizer | None = None,
    ):
        if isinstance(tail, bool) or not isinstance(tail, (int, float)) or not 0 < tail < float("inf"):
            raise ValueError(f"tail={tail!r} must be a positive number")
        super().__init__(
            digits,
            eval_size=eval_size,
            holdout_fraction=holdout_fraction,
            partial_credit=partial_credit,
            tokenizer=tokenizer,
        )
        self.tail = float(tail)
        self._lengths = range(1, digits + 1)
        self._cumulative = list(itertools.accumulate(length ** -(1.0 + self.tail) for length in self._lengths))

    def _eval_seed(self) -> str:
        return f"{self.name}/eval/{self.digits}/{self.tail}"

    def _length(self, rng: random.Random) -> int:
        return rng.choices(self._lengths, cum_weights=self._cumulative)[0]


def _example(a: int, b: int) -> Example:
    return Example(prompt=f"{a}+{b}=", answer=str(a + b), id=f"addition:{a}+{b}")
