"""The shared ``Task`` behaviour, exercised through the addition task."""

import pytest

from nibble.tasks.addition import AdditionTask


def test_train_examples_rejects_a_negative_or_non_int_count():
    task = AdditionTask()
    assert task.train_examples(0, seed=0) == []
    for n in (-1, 2.0, True):
        with pytest.raises(ValueError, match="n="):
            task.train_examples(n, seed=0)


def test_score_many_matches_reward_and_checks_lengths():
    task = AdditionTask()
    examples = task.eval_examples()[:3]
    responses = [examples[0].answer, "0", examples[2].answer]
    assert task.score_many(examples, responses) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"examples \(3\) and responses \(2\) differ in length"):
        task.score_many(examples, responses[:2])


def test_prompt_and_answer_ids_frame_the_text_with_bos_and_eos():
    with AdditionTask() as task:
        example = task.eval_examples()[0]
        tok = task.tokenizer
        assert task.prompt_ids(example) == [tok.bos_id, *tok.encode(example.prompt)]
        assert task.answer_ids(example) == [*tok.encode(example.answer), tok.eos_id]
