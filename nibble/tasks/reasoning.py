"""Math reasoning for pretrained chat models: reasoning-gym's generated problems to train on, a real benchmark held out.

Training problems come from ``reasoning-gym`` (0.1.25, Apache-2.0), procedural generators whose every
problem carries its verified answer and is scored by the generator's own ``score_answer``:
``basic_arithmetic`` (expressions such as ``-5 * (3 + 7) / 2``), ``chain_sum`` (sums and differences
of several numbers) and ``gsm_symbolic`` (GSM8K-style word problems from templates with fresh names and
numbers). The held-out split is GSM8K test (default), MATH-500, or reasoning-gym problems drawn from a
seed no training stream uses. Every problem reaches the policy in the model's chat template (system
prompt, user turn, generation prompt) when its tokenizer directory has one, as plain text otherwise.

Rewards read the response's final answer (``nibble.tasks.answers``): GSM8K earns 1 when that number
equals the reference, MATH-500 when ``math-verify`` finds the answers equivalent, and reasoning-gym
problems what ``score_answer`` gives the answer (its number written plainly, when it states one).

Contamination: reasoning-gym's ``gsm_symbolic`` templates were written from GSM8K *test* problems (via
Apple's GSM-Symbolic). Training on it with GSM8K held out therefore evaluates on the problems those
templates came from unless they are removed: ``decontaminate`` (on by default for that pairing) drops
each template's source problem from the held-out set, found by comparing their words.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from nibble.tasks.answers import canonical_number, extract_answer
from nibble.tasks.base import Example, Task, check_int
from nibble.tasks.chat import PromptFormat
from nibble.tasks.eval_sets import gsm8k_test, math500
from nibble.tasks.tokenizers import HFTokenizer, Tokenizer

DATASETS = ("basic_arithmetic", "chain_sum", "gsm_symbolic")
HELD_OUT = ("gsm8k", "math500", "generated")
RESERVED_OPTIONS = ("seed", "size")  # reasoning-gym config fields the task sets itself
DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem step by step. End your response with 'The answer is N.' where N is the final answer."
)
CHUNK_SIZE = 1000  # problems per seeded reasoning-gym dataset; the stream moves to a new seed after each
GENERATED_EVAL_SIZE = 500
# Word overlap (Jaccard) from which a template's closest GSM8K problem counts as its source. Each of the
# 100 templates' closest problem scores 0.40-0.95 and the runner-up at most 0.53, all 100 distinct.
TEMPLATE_MATCH_MIN = 0.3


class ReasoningGymTask(Task):
    """Train on a reasoning-gym generator, evaluate on a held-out benchmark, in the model's chat template.

    Args:
        dataset: the reasoning-gym generator: ``basic_arithmetic``, ``chain_sum`` or ``gsm_symbolic``.
        tokenizer: the model directory (or its ``tokenizer.json``) — its ``tokenizer_config.json``'s
            ``chat_template`` formats the prompts — or a ``Tokenizer``.
        dataset_options: the generator's own configuration (e.g. ``{"min_terms": 2, "max_terms": 4}``
            for ``chain_sum``); not ``seed`` or ``size``, which the task sets.
        held_out: ``gsm8k`` (GSM8K test, 1,319 problems), ``math500`` or ``generated`` (the generator's
            problems from a seed reserved for evaluation).
        eval_size: how many held-out problems, the first ones in the set's order; default all of
            GSM8K/MATH-500 (after decontamination), 500 generated ones.
        system_prompt: the system turn; ``None`` or ``""`` for none.
        chat_template: ``False`` formats prompts as plain text even when the model has a chat template.
        decontaminate: drop from a GSM8K held-out set the problems ``gsm_symbolic``'s templates were made
            from; default: exactly when training on ``gsm_symbolic`` with GSM8K held out.
        max_response_tokens: generation budget of one response, eos included.

    Raises:
        ValueError: naming the option that is invalid (an unknown dataset or held-out set, a bad
            reasoning-gym option with the generator's own message, a missing tokenizer file).
    """

    name = "reasoning_gym"

    def __init__(
        self,
        dataset: str = "gsm_symbolic",
        *,
        tokenizer: Tokenizer | str | Path,
        dataset_options: dict[str, Any] | None = None,
        held_out: str = "gsm8k",
        eval_size: int | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        chat_template: bool = True,
        decontaminate: bool | None = None,
        max_response_tokens: int = 512,
    ):
        if dataset not in DATASETS:
            raise ValueError(f"dataset={dataset!r} is not one of {', '.join(DATASETS)}")
        if held_out not in HELD_OUT:
            raise ValueError(f"held_out={held_out!r} is not one of {', '.join(HELD_OUT)}")
        if eval_size is not None:
            check_int("eval_size", eval_size, 1)
        check_int("max_response_tokens", max_response_tokens, 1)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string or null, got {type(system_prompt).__name__}")
        if decontaminate and held_out != "gsm8k":
            raise ValueError(f"decontaminate=True applies to held_out='gsm8k' only, not {held_out!r}")
        self.dataset = dataset
        self.dataset_options = _checked_options(dataset, dataset_options)
        self.held_out = held_out
        self.decontaminate = (
            (dataset == "gsm_symbolic" and held_out == "gsm8k") if decontaminate is None else decontaminate
        )
        self.max_response_tokens = max_response_tokens
        super().__init__(_resolve_tokenizer(tokenizer))
        self.prompt_format = _prompt_format(self.tokenizer, system_prompt, chat_template)
        self._eval = self._held_out_examples(eval_size)
        self._eval_prompts = {e.prompt for e in self._eval}
        self._score_answer = _create(dataset, self.dataset_options, seed=0, size=1).score_answer

    def train_stream(self, seed: int) -> Iterator[Example]:
        """Generated problems, CHUNK_SIZE per reasoning-gym seed derived from ``seed``; never a held-out one."""
        for chunk in itertools.count():
            chunk_seed = _derive_seed(f"reasoning_gym/{self.dataset}/train/{seed}/{chunk}")
            for example in self._generated(chunk_seed, CHUNK_SIZE):
                if example.prompt not in self._eval_prompts:
                    yield example

    def eval_examples(self) -> list[Example]:
        return list(self._eval)

    def prompt_ids(self, example: Example) -> list[int]:
        """The problem in the model's chat template (which places any bos itself), or ``[bos]`` + plain text."""
        ids = self.tokenizer.encode(self.prompt_format.render(example.prompt))
        return ids if self.prompt_format.is_chat else [self.tokenizer.bos_id, *ids]

    def reward(self, example: Example, response: str) -> float:
        """In [0, 1]; 1 for a right final answer. An unreadable response earns 0 (it is not a scoring failure)."""
        source = example.id.split(":", 1)[0]
        if source == "gsm8k":
            return gsm8k_reward(response, example.answer)
        if source == "math500":
            return math_reward(response, example.answer)
        return self._reasoning_gym_reward(response, example.answer)

    def _reasoning_gym_reward(self, response: str, answer: str) -> float:
        found = extract_answer(response)
        if found is None:
            given = None
        else:
            given = canonical_number(found.number) if found.number is not None else found.text
        return float(self._score_answer(given, {"answer": answer, "metadata": {}}))

    def _generated(self, seed: int, size: int) -> Iterator[Example]:
        data = _create(self.dataset, self.dataset_options, seed=seed, size=size)
        for index in range(size):
            entry = data[index]
            yield Example(prompt=entry["question"], answer=str(entry["answer"]), id=f"{self.dataset}:{seed}:{index}")

    def _held_out_examples(self, eval_size: int | None) -> tuple[Example, ...]:
        if self.held_out == "generated":
            seed = _derive_seed(f"reasoning_gym/{self.dataset}/eval")
            examples = tuple(self._generated(seed, eval_size or GENERATED_EVAL_SIZE))
        else:
            examples = gsm8k_test() if self.held_out == "gsm8k" else math500()
            if self.decontaminate:
                sources = gsm_symbolic_sources()
                examples = tuple(e for e in examples if e.id not in sources)
        if eval_size is not None and eval_size > len(examples):
            raise ValueError(
                f"eval_size={eval_size} is more than the {len(examples)} problems of held_out={self.held_out!r}"
            )
        return examples[:eval_size]


def gsm8k_reward(response: str, answer: str) -> float:
    """1.0 when the response's final answer is the number ``answer``, else 0.0."""
    found = extract_answer(response)
    return 1.0 if found is not None and found.number is not None and canonical_number(found.number) == answer else 0.0


def math_reward(response: str, answer: str) -> float:
    """1.0 when ``math-verify`` finds the response's final answer (a ``\\boxed{}`` one first) equivalent
    to the LaTeX ``answer``, else 0.0."""
    from math_verify import parse, verify  # imported on use: it loads sympy and an ANTLR parser

    found = extract_answer(response)
    if found is None:
        return 0.0
    try:
        gold, given = parse(f"${answer}$"), parse(f"${found.text}$")
        return 1.0 if gold and given and verify(gold, given) else 0.0
    except Exception:  # math-verify's parsers raise many kinds on odd LaTeX: an unreadable answer
        return 0.0


@cache
def gsm_symbolic_sources() -> frozenset[str]:
    """Ids of the GSM8K test problems reasoning-gym's ``gsm_symbolic`` templates were written from.

    Each template's instance (seed 0) is matched to the GSM8K problem sharing the most words with it
    (numbers and case ignored); a match with word overlap below ``TEMPLATE_MATCH_MIN`` is not a source.
    """
    from random import Random

    from reasoning_gym.arithmetic.gsm_symbolic import generators_00_49, generators_50_99

    problems = [(e.id, _words(e.prompt)) for e in gsm8k_test()]
    found = set()
    for module in (generators_00_49, generators_50_99):
        for name in dir(module):
            if name.startswith("generate_"):
                words = _words(getattr(module, name)(Random(0), 1.0)["question"])
                best_id, best = max(((i, len(words & w) / len(words | w)) for i, w in problems), key=lambda x: x[1])
                if best >= TEMPLATE_MATCH_MIN:
                    found.add(best_id)
    return frozenset(found)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _derive_seed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big")


def _create(dataset: str, options: dict[str, Any], *, seed: int, size: int) -> Any:
    import reasoning_gym  # imported on use: it loads every generator it has

    return reasoning_gym.create_dataset(dataset, seed=seed, size=size, **options)


def _checked_options(dataset: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """``options`` after building the generator's configuration once with them (its own validation)."""
    options = dict(options or {})
    reserved = sorted(set(options) & set(RESERVED_OPTIONS))
    if reserved:
        raise ValueError(f"dataset_options may not set {', '.join(reserved)}: the task sets them")
    try:
        _create(dataset, options, seed=0, size=1)
    except (TypeError, AssertionError, ValueError, KeyError) as exc:
        raise ValueError(
            f"dataset_options={options!r} for {dataset!r} are not valid: {exc or type(exc).__name__}"
        ) from exc
    return options


def _resolve_tokenizer(tokenizer: Tokenizer | str | Path) -> Tokenizer:
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, Path)):
        return HFTokenizer(tokenizer)
    raise ValueError(
        f"tokenizer must be a model directory, a tokenizer.json or a Tokenizer, got {type(tokenizer).__name__}"
    )


def _prompt_format(tokenizer: Tokenizer, system_prompt: str | None, chat_template: bool) -> PromptFormat:
    if chat_template and isinstance(tokenizer, HFTokenizer):
        return PromptFormat.from_model_dir(tokenizer.path.parent, system_prompt=system_prompt)
    return PromptFormat(None, system_prompt=system_prompt)
