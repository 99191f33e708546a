"""What every task offers: examples, a fixed held-out split, a reward, and the tokenizer that goes with it."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nibble.tasks.tokenizers import Tokenizer


@dataclass(frozen=True)
class Example:
    """One problem: the model sees ``prompt`` and should answer ``answer``.

    ``id`` names the problem, stably across processes and runs: two examples with the same id are the
    same problem (a training sampler may draw a problem more than once).
    """

    prompt: str
    answer: str
    id: str


class Task(ABC):
    """A verifiable task. Subclasses set ``name`` and ``max_response_tokens`` and implement the abstract methods.

    The evaluation split is fixed by the task's options alone and disjoint from every example
    ``train_stream`` can produce, for any seed.
    """

    name: str
    max_response_tokens: int  # generation budget hint for one response, eos included

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    @abstractmethod
    def train_stream(self, seed: int) -> Iterator[Example]:
        """An endless, reproducible stream of training examples (the same ``seed`` gives the same stream)."""

    @abstractmethod
    def eval_examples(self) -> list[Example]:
        """The held-out split, in a fixed order."""

    @abstractmethod
    def reward(self, example: Example, response: str) -> float | None:
        """Reward of ``response`` (decoded text before eos). ``None``: scoring failed, drop the response."""

    def train_examples(self, n: int, seed: int) -> list[Example]:
        """The first ``n`` examples of ``train_stream(seed)``. Raises ``ValueError`` when ``n`` is negative."""
        check_int("n", n, 0)
        return list(itertools.islice(self.train_stream(seed), n))

    def score_many(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float | None]:
        """``reward`` over pairs; tasks with costly rewards override it to batch the work."""
        if len(examples) != len(responses):
            raise ValueError(f"examples ({len(examples)}) and responses ({len(responses)}) differ in length")
        return [self.reward(example, response) for example, response in zip(examples, responses, strict=True)]

    def prompt_ids(self, example: Example) -> list[int]:
        """What the policy is conditioned on: ``[bos] + encode(prompt)``."""
        return [self.tokenizer.bos_id, *self.tokenizer.encode(example.prompt)]

    def answer_ids(self, example: Example) -> list[int]:
        """The reference response as the policy should produce it: ``encode(answer) + [eos]``."""
        return [*self.tokenizer.encode(example.answer), self.tokenizer.eos_id]

    def close(self) -> None:  # noqa: B027 (a hook: most tasks hold nothing to release)
        """Release resources (reward worker processes); the default task holds none."""

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_int(field: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ``ValueError`` naming ``field`` unless ``value`` is an int (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{field}={value!r} must be an int {bound}")
