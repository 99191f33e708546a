"""The sampler's pure rollout step: prompts, an engine and a task in, scored wire groups out.

No stream, no admission, no metrics: :class:`nibble.sampler.service.Sampler` does that I/O around it,
and benchmarks and tests call the same step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nibble.sampler.engine import Engine, Sample
from nibble.sampler.groups import build_group
from nibble.tasks import Example, Task, decode_response
from nibble.wire import pb

Naming = Callable[[Example, int], tuple[list[str], str]]
"""``(example, responses) -> (trajectory ids, group id)``: called once per example, in order."""


class GenerationFailed(Exception):
    """The engine failed to generate a batch; the engine's own exception is ``__cause__``."""


@dataclass(frozen=True)
class Sampling:
    """How a batch is sampled: ``group_size`` responses per prompt, each of at most ``max_new_tokens``
    tokens, at ``temperature`` with nucleus ``top_p``."""

    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float


@dataclass(frozen=True)
class ScoredGroup:
    """One prompt's rollout: its wire ``group`` (``None`` when fewer than 2 responses survived), the
    responses ``removed`` because their reward failed, and every sampled response's token count."""

    group: pb.TrajectoryGroup | None
    removed: int
    response_tokens: list[int]


def rollout(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    sampling: Sampling,
    *,
    seed: int,
    sampler_id: str,
    naming: Naming,
    started_at: float,
) -> list[ScoredGroup]:
    """Sample ``sampling.group_size`` responses per example with ``engine`` (seeded by ``seed``), reward
    them with ``task`` and build one wire group per example, stamped with the engine's policy version,
    ``sampler_id`` and ``started_at`` (Unix seconds); ids come from ``naming``.

    Raises:
        GenerationFailed: the engine raised (any engine may fail in its own way); nothing was scored.
    """
    version = engine.policy_version
    prompts = [task.prompt_ids(e) for e in examples]
    try:
        samples = engine.generate(
            prompts,
            n=sampling.group_size,
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop_tokens=[task.tokenizer.eos_id],
            seed=seed,
        )
    except Exception as exc:
        raise GenerationFailed(f"{type(exc).__name__}: {exc}") from exc
    return [
        score_group(task, example, prompt, group_samples, sampling.temperature, version, sampler_id, naming, started_at)
        for example, prompt, group_samples in zip(examples, prompts, samples, strict=True)
    ]


def score_group(
    task: Task,
    example: Example,
    prompt: list[int],
    samples: Sequence[Sample],
    temperature: float,
    version: int,
    sampler_id: str,
    naming: Naming,
    started_at: float,
) -> ScoredGroup:
    """Reward one example's ``samples`` and build its wire group (see :func:`rollout`)."""
    responses = [decode_response(task, x.tokens) for x in samples]
    rewards = task.score_many([example] * len(samples), responses)
    trajectory_ids, group_id = naming(example, len(samples))
    outcome = build_group(
        example_id=example.id,
        prompt_tokens=prompt,
        samples=samples,
        rewards=rewards,
        trajectory_ids=trajectory_ids,
        group_id=group_id,
        policy_version=version,
        sampler_id=sampler_id,
        temperature=temperature,
        started_at=started_at,
    )
    return ScoredGroup(outcome.group, outcome.removed, [len(x.tokens) for x in samples])
