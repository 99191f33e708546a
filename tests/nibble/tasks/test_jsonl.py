"""JSONL tasks: loading, line-numbered errors, a deterministic split, and the three kinds of reward."""

import re

import pytest

from nibble.tasks.jsonl import JsonlTask
from nibble.tasks.tokenizers import CharTokenizer, HFTokenizer
from tests.helpers import minilm_tokenizer_json, write_jsonl


def problems(n):
    return [{"prompt": f"What is {i} times 3?", "answer": str(3 * i), "source": "test"} for i in range(n)]


@pytest.fixture
def path(tmp_path):
    return write_jsonl(tmp_path / "math.jsonl", problems(40))


def test_a_good_file_splits_into_disjoint_reproducible_train_and_eval(path):
    task = JsonlTask(path)
    train, held_out = task.train_examples(36, seed=0), task.eval_examples()
    assert len(held_out) == 4  # eval_fraction 0.1 of 40
    assert len({e.id for e in train}) == 36  # one epoch visits every training problem once
    assert not {e.id for e in train} & {e.id for e in held_out}
    assert JsonlTask(path).eval_examples() == held_out
    assert JsonlTask(path, seed=1).eval_examples() != held_out
    assert task.train_examples(100, seed=5) == JsonlTask(path).train_examples(100, seed=5)
    assert task.train_examples(36, seed=5) != task.train_examples(36, seed=5 + 1)
    example = held_out[0]
    assert example.prompt.startswith("What is ") and example.id.startswith("jsonl:")
    assert task.reward(example, f" {example.answer} ") == 1.0 and task.reward(example, "x") == 0.0


def test_default_tokenizer_covers_the_file_and_a_tokenizer_json_can_be_given(path):
    task = JsonlTask(path)
    assert isinstance(task.tokenizer, CharTokenizer)
    for example in task.eval_examples():
        assert task.tokenizer.decode(task.tokenizer.encode(example.prompt)) == example.prompt
    assert isinstance(JsonlTask(path, tokenizer=minilm_tokenizer_json()).tokenizer, HFTokenizer)
    assert JsonlTask(path, tokenizer=task.tokenizer).tokenizer is task.tokenizer


def test_blank_lines_are_skipped_and_repeats_kept_once(tmp_path):
    rows = [*problems(3), "", "   ", problems(1)[0]]
    task = JsonlTask(write_jsonl(tmp_path / "x.jsonl", rows), eval_fraction=0.0)
    assert task.eval_examples() == []
    assert len({e.id for e in task.train_examples(30, seed=0)}) == 3


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ({"prompt": "p"}, "missing field 'answer'"),
        ({"answer": "1"}, "missing field 'prompt'"),
        ({"prompt": "p", "answer": 1}, "field 'answer' must be a string, got int"),
        ({"prompt": ["p"], "answer": "1"}, "field 'prompt' must be a string, got list"),
        ('{"prompt": "p", "answer": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [*problems(2), "", bad_line, *problems(1)])
    with pytest.raises(ValueError, match=message) as info:
        JsonlTask(path)
    assert f"{path}:4:" in str(info.value)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:1: not UTF-8")):
        JsonlTask(path)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_file_is_an_error(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(f"{path}: no examples")):
        JsonlTask(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.jsonl: cannot read"):
        JsonlTask(tmp_path / "nope.jsonl")


def test_numeric_reward_compares_the_last_number(tmp_path):
    rows = [{"prompt": "half of 3?", "answer": "3/2"}, {"prompt": "2-5?", "answer": "-3"}]
    task = JsonlTask(write_jsonl(tmp_path / "n.jsonl", rows), reward="numeric", eval_fraction=0.5)
    example = task.eval_examples()[0]
    assert task.reward(example, f"I think 7, no wait: {example.answer}") == 1.0
    assert task.reward(example, f"{example.answer} or 7") == 0.0


def test_numeric_reward_needs_numeric_answers(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [*problems(2), {"prompt": "p", "answer": "\\frac{1}{2}"}])
    with pytest.raises(ValueError, match=r"n.jsonl:3: field 'answer' '\\\\frac\{1\}\{2\}' is not a number"):
        JsonlTask(path, reward="numeric")


def test_custom_reward_runs_in_a_worker_and_failures_become_none(path):
    with JsonlTask(path, reward="tests.nibble.tasks.reward_fixtures:behaves", reward_timeout=5.0) as task:
        examples = task.eval_examples()[:3]
        responses = [examples[0].answer, "raise", "0"]
        assert task.score_many(examples, responses) == [1.0, None, 0.0]
        assert task.reward(examples[1], examples[1].answer) == 1.0
        assert task.runner.counts["exception"] == 1
    assert task.runner.pid is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reward": "fuzzy"}, "reward='fuzzy' is not one of"),
        ({"reward": "tests.nibble.tasks.reward_fixtures:missing"}, "has no attribute 'missing'"),
        ({"eval_fraction": 1.0}, "eval_fraction=1.0"),
        ({"max_response_tokens": 0}, "max_response_tokens=0"),
        ({"tokenizer": 3}, "tokenizer must be"),
    ],
)
def test_bad_options_are_value_errors_naming_them(path, options, message):
    with pytest.raises(ValueError, match=message):
        JsonlTask(path, **options)


def test_a_split_that_leaves_nothing_to_train_on_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="leave none for training"):
        JsonlTask(write_jsonl(tmp_path / "one.jsonl", problems(1)))
