"""Tasks read from JSON lines of ``{"prompt": ..., "answer": ...}`` objects (DAPO-math-17k's shape, flattened)."""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from nibble.tasks.base import Example, Task, check_int
from nibble.tasks.matching import exact_match, numeric_match, parse_number
from nibble.tasks.rewards import RewardRunner
from nibble.tasks.tokenizers import CharTokenizer, HFTokenizer, Tokenizer

logger = logging.getLogger(__name__)

BUILTIN_REWARDS: dict[str, Callable[[str, str], float]] = {"exact": exact_match, "numeric": numeric_match}
FIELDS = ("prompt", "answer")


def read_jsonl(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, prompt, answer)`` of every non-blank line (numbered from 1); other keys are ignored.

    Raises:
        ValueError: the file is missing or holds no example, or — naming ``file:line`` — a line is not
            UTF-8, not JSON, not an object, or lacks a string ``prompt``/``answer``.
    """
    try:
        raw_lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    rows = []
    for number, raw in enumerate(raw_lines, 1):
        if raw.strip():
            rows.append((number, *_parse_line(f"{path}:{number}", raw)))
    if not rows:
        raise ValueError(f"{path}: no examples (the file is empty)")
    return rows


def _parse_line(where: str, raw: bytes) -> tuple[str, str]:
    try:
        record = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object with {' and '.join(FIELDS)}, got {type(record).__name__}")
    for field in FIELDS:
        if field not in record:
            raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(record[field], str):
            raise ValueError(f"{where}: field {field!r} must be a string, got {type(record[field]).__name__}")
    return record["prompt"], record["answer"]


class JsonlTask(Task):
    """Problems from a JSONL file, split deterministically into train and held-out evaluation.

    Args:
        path: the JSONL file. Blank lines are skipped; repeated (prompt, answer) pairs are kept once.
        tokenizer: a ``Tokenizer``, a path to a ``tokenizer.json`` (or its folder), or ``None`` for a
            ``CharTokenizer`` over the characters that occur in the file.
        reward: ``"exact"`` (strings equal after stripping), ``"numeric"`` (the last number of the
            response equals the answer within 1e-6 relative; every answer must then be a number), or an
            import path ``"package.module:function"`` run by a ``RewardRunner``.
        eval_fraction: share of problems held out, in [0, 1) (at least one when positive).
        seed: decides the split, a hash of (seed, example id) ordering the problems.
        max_response_tokens: generation budget hint.
        reward_timeout: seconds per call of a custom reward function.

    Raises:
        ValueError: naming the file and line of a bad line, or the option that is invalid.
    """

    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        *,
        tokenizer: Tokenizer | str | Path | None = None,
        reward: str = "exact",
        eval_fraction: float = 0.1,
        seed: int = 0,
        max_response_tokens: int = 1024,
        reward_timeout: float = 5.0,
    ):
        if not 0.0 <= eval_fraction < 1.0:
            raise ValueError(f"eval_fraction={eval_fraction!r} must lie in [0, 1)")
        check_int("max_response_tokens", max_response_tokens, 1)
        if not isinstance(reward, str) or (reward not in BUILTIN_REWARDS and ":" not in reward):
            raise ValueError(f"reward={reward!r} is not one of 'exact', 'numeric' or a 'package.module:function' path")
        self.path = Path(path)
        rows = read_jsonl(self.path)
        if reward == "numeric":
            _check_numeric_answers(self.path, rows)
        examples = _unique_examples(self.path, rows)
        self._train, self._eval = _split(examples, eval_fraction, seed, self.path)
        super().__init__(_resolve_tokenizer(tokenizer, examples))
        self.max_response_tokens = max_response_tokens
        self.reward_name = reward
        self._match = BUILTIN_REWARDS.get(reward)
        self.runner = None if self._match else RewardRunner(reward, timeout=reward_timeout)

    def train_stream(self, seed: int) -> Iterator[Example]:
        """Epochs over the training split, each in a fresh seeded order."""
        rng = random.Random(f"jsonl/train/{seed}")
        while True:
            epoch = list(self._train)
            rng.shuffle(epoch)
            yield from epoch

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def reward(self, example: Example, response: str) -> float | None:
        if self._match is not None:
            return self._match(response, example.answer)
        return self.runner.score(example.prompt, response, example.answer)

    def score_many(self, examples: Sequence[Example], responses: Sequence[str]) -> list[float | None]:
        if self.runner is None:
            return super().score_many(examples, responses)
        if len(examples) != len(responses):
            raise ValueError(f"examples ({len(examples)}) and responses ({len(responses)}) differ in length")
        items = [(e.prompt, r, e.answer) for e, r in zip(examples, responses, strict=True)]
        return self.runner.score_many(items)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def _check_numeric_answers(path: Path, rows: list[tuple[int, str, str]]) -> None:
    for number, _, answer in rows:
        if parse_number(answer) is None:
            raise ValueError(f"{path}:{number}: field 'answer' {answer!r} is not a number (reward='numeric')")


def _unique_examples(path: Path, rows: list[tuple[int, str, str]]) -> list[Example]:
    """Examples in file order, id a hash of (prompt, answer); a repeat of an earlier pair is dropped."""
    examples: dict[str, Example] = {}
    for _, prompt, answer in rows:
        digest = hashlib.blake2b(f"{prompt}\0{answer}".encode(errors="surrogatepass"), digest_size=8).hexdigest()
        examples.setdefault(f"jsonl:{digest}", Example(prompt=prompt, answer=answer, id=f"jsonl:{digest}"))
    if len(examples) < len(rows):
        logger.info("%s: dropped %d repeated (prompt, answer) lines", path, len(rows) - len(examples))
    return list(examples.values())


def _split(examples: list[Example], eval_fraction: float, seed: int, path: Path) -> tuple[list[Example], list[Example]]:
    """(train, eval), each in file order: eval is the ``eval_fraction`` of ids that hash lowest with ``seed``."""
    n_eval = max(1, round(eval_fraction * len(examples))) if eval_fraction > 0 else 0
    if n_eval >= len(examples):
        raise ValueError(
            f"{path}: {len(examples)} distinct examples leave none for training at eval_fraction={eval_fraction}"
        )

    def rank(example: Example) -> bytes:
        return hashlib.blake2b(f"{seed}\0{example.id}".encode(), digest_size=8).digest()

    held_out = {e.id for e in sorted(examples, key=rank)[:n_eval]}
    return [e for e in examples if e.id not in held_out], [e for e in examples if e.id in held_out]


def _resolve_tokenizer(tokenizer: Tokenizer | str | Path | None, examples: list[Example]) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, Path)):
        return HFTokenizer(tokenizer)
    if tokenizer is None:
        return CharTokenizer("".join(sorted({c for e in examples for c in e.prompt + e.answer})))
    raise ValueError(f"tokenizer must be a Tokenizer, a path to tokenizer.json or None, got {type(tokenizer).__name__}")
