"""The sampler's pure rollout step: deterministic groups from a fixed engine seed, rewards from the task,
one logprob per token, and engine failures named, all without a stream or metrics."""

import pytest
import torch

from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.sampler.engine import BuiltinEngine, Engine, Sample
from nibble.sampler.rollout import GenerationFailed, Sampling, rollout
from nibble.tasks import decode_response, get_task

SAMPLING = Sampling(group_size=4, max_new_tokens=5, temperature=1.0, top_p=1.0)


@pytest.fixture(scope="module")
def task():
    with get_task("addition", digits=1, eval_size=4, holdout_fraction=0.5) as chosen:
        yield chosen


def engine_for(task, version: int = 3) -> BuiltinEngine:
    torch.manual_seed(0)
    config = tiny(vocab_size=task.tokenizer.vocab_size)
    model = MoETransformer(config, PrecisionPlan(num_layers=config.num_hidden_layers)).pack()
    return BuiltinEngine(model, pad_id=task.tokenizer.pad_id, policy_version=version)


def naming(example, responses: int) -> tuple[list[str], str]:
    return [f"{example.id}/{i}" for i in range(responses)], f"{example.id}/g"


def run(engine, task, examples, seed: int = 7):
    return rollout(engine, task, examples, SAMPLING, seed=seed, sampler_id="s", naming=naming, started_at=1.0)


def test_a_fixed_engine_seed_gives_the_same_scored_groups(task):
    engine = engine_for(task)
    examples = [next(task.train_stream(seed=0)) for _ in range(3)]
    first, again = run(engine, task, examples), run(engine, task, examples)
    assert len(first) == len(examples)
    for a, b in zip(first, again, strict=True):
        assert a.group is not None and a.group.SerializeToString(deterministic=True) == _without_clock(b.group, a)
        assert a.removed == b.removed == 0 and a.response_tokens == b.response_tokens


def test_groups_carry_the_tasks_rewards_one_logprob_per_token_and_the_engines_version(task):
    engine = engine_for(task, version=3)
    examples = [next(task.train_stream(seed=1)) for _ in range(2)]
    for example, scored in zip(examples, run(engine, task, examples), strict=True):
        group = scored.group
        assert (group.policy_version, group.sampler_id, group.started_at) == (3, "s", 1.0)
        assert group.group_id == f"{example.id}/g" and group.prompt_tokens == task.prompt_ids(example)
        assert [r.trajectory_id for r in group.responses] == [f"{example.id}/{i}" for i in range(SAMPLING.group_size)]
        responses = [decode_response(task, list(r.tokens)) for r in group.responses]
        assert [r.reward for r in group.responses] == task.score_many([example] * len(responses), responses)
        for response in group.responses:
            assert len(response.logprobs) == len(response.tokens) <= SAMPLING.max_new_tokens
            assert all(lp <= 0.0 for lp in response.logprobs)
        assert scored.response_tokens == [len(r.tokens) for r in group.responses]


class Scripted(Engine):
    """An engine that answers every prompt with ``samples``, or raises ``error``."""

    policy_version = 0

    def __init__(self, samples=None, error: Exception | None = None):
        self.samples, self.error = samples, error

    def generate(self, prompts, **options):
        if self.error is not None:
            raise self.error
        return [list(self.samples) for _ in prompts]

    def pause(self) -> None: ...
    def update_weights(self, version, state) -> None: ...
    def resume(self) -> None: ...


def test_an_engine_error_is_named_and_nothing_is_scored(task):
    error = RuntimeError("server gone")
    with pytest.raises(GenerationFailed, match="RuntimeError: server gone") as raised:
        run(Scripted(error=error), task, [next(task.train_stream(seed=0))])
    assert raised.value.__cause__ is error


def test_a_group_without_two_rewarded_responses_is_not_built_and_its_removals_are_counted(task):
    samples = [Sample(tokens=[], logprobs=[], finish_reason="length"), Sample([task.tokenizer.eos_id], [-0.5], "stop")]
    [scored] = run(Scripted(samples), task, [next(task.train_stream(seed=0))])
    assert scored.group is None and scored.removed == 1 and scored.response_tokens == [0, 1]


def _without_clock(group, like):
    """``group`` serialised with ``finished_at`` (the wall clock when it was built) taken from ``like``."""
    copy = type(group)()
    copy.CopyFrom(group)
    copy.finished_at = like.group.finished_at
    return copy.SerializeToString(deterministic=True)
