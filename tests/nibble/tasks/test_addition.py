"""Addition: correct problems, a held-out split disjoint by construction, a difficulty knob, an exact reward."""

from collections import Counter

import pytest

from nibble.tasks import get_task
from nibble.tasks.addition import AdditionTask, HeavyTailAdditionTask


def operands(example):
    a, b = example.prompt.removesuffix("=").split("+")
    return a, b


def unordered(example):
    return frozenset(int(x) for x in operands(example))


def test_prompts_and_answers_are_correct_and_encodable():
    task = AdditionTask(digits=3)
    for example in task.train_examples(200, seed=0) + task.eval_examples():
        a, b = operands(example)
        assert example.prompt == f"{a}+{b}=" and example.answer == str(int(a) + int(b))
        assert example.id == f"addition:{a}+{b}"
        assert len(task.answer_ids(example)) <= task.max_response_tokens
        assert task.tokenizer.decode(task.prompt_ids(example)) == f"<bos>{example.prompt}"


def test_eval_split_is_disjoint_from_training_in_either_order_and_at_every_difficulty():
    held_out = {unordered(e) for e in AdditionTask(digits=2).eval_examples()}
    assert len(held_out) > 150  # 256 ordered pairs, some held out in both orders
    for task in (AdditionTask(digits=2), AdditionTask(digits=3, mixed_lengths=True)):
        trained = {unordered(e) for e in task.train_examples(20_000, seed=1)}
        assert not held_out & trained
    # digits=2 has only 4005 unordered pairs: training covers every one of them that is not held out.
    assert len({unordered(e) for e in AdditionTask(digits=2).train_examples(20_000, seed=1)}) > 3700


def test_split_and_streams_are_reproducible_and_seeded():
    assert AdditionTask(digits=4).eval_examples() == AdditionTask(digits=4).eval_examples()
    task = AdditionTask(digits=4)
    assert task.train_examples(50, seed=3) == AdditionTask(digits=4).train_examples(50, seed=3)
    assert task.train_examples(50, seed=3) != task.train_examples(50, seed=4)
    assert task.train_examples(10, seed=3) == task.train_examples(50, seed=3)[:10]


def test_eval_size_is_a_knob_with_distinct_problems():
    examples = AdditionTask(digits=3, eval_size=100).eval_examples()
    assert len(examples) == 100 == len({e.id for e in examples})
    assert len(AdditionTask(digits=3).eval_examples()) == 256


@pytest.mark.parametrize("digits", [2, 4, 6])
def test_digits_sets_operand_and_response_lengths(digits):
    task = AdditionTask(digits=digits)
    examples = task.train_examples(100, seed=0) + task.eval_examples()
    assert {len(x) for e in examples for x in operands(e)} == {digits}
    assert task.max_response_tokens == digits + 2
    assert max(len(e.answer) for e in examples) == digits + 1


def test_mixed_lengths_draw_every_length_up_to_digits():
    task = AdditionTask(digits=4, mixed_lengths=True)
    lengths = {len(x) for e in task.train_examples(400, seed=0) for x in operands(e)}
    assert lengths == {1, 2, 3, 4}


def test_reward_is_one_for_exactly_the_answer_and_zero_otherwise():
    task = AdditionTask(digits=3)
    example = task.eval_examples()[0]
    assert task.reward(example, example.answer) == 1.0
    assert task.reward(example, f" {example.answer}\n") == 1.0
    for wrong in ("", "0" + example.answer, example.answer[:-1], str(int(example.answer) + 1), "<eos>"):
        assert task.reward(example, wrong) == 0.0


def test_partial_credit_is_off_by_default_and_counts_right_aligned_digits():
    assert AdditionTask(digits=3).partial_credit == 0.0
    task = AdditionTask(digits=3, partial_credit=0.5)
    example = task.eval_examples()[0]
    wrong_first_digit = str((int(example.answer[0]) + 1) % 10) + example.answer[1:]
    assert task.reward(example, wrong_first_digit) == pytest.approx(
        0.5 * (len(example.answer) - 1) / len(example.answer)
    )
    assert task.reward(example, "12a") == 0.0
    assert task.reward(example, example.answer) == 1.0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"digits": 0}, "digits"),
        ({"digits": 31}, "digits"),
        ({"digits": 2.0}, "digits"),
        ({"eval_size": 0}, "eval_size"),
        ({"holdout_fraction": 0.0}, "holdout_fraction"),
        ({"partial_credit": 1.0}, "partial_credit"),
    ],
)
def test_bad_options_are_value_errors_naming_the_option(options, field):
    with pytest.raises(ValueError, match=f"{field}="):
        AdditionTask(**options)


def test_too_large_an_eval_split_for_the_problem_space_is_an_error():
    assert len(AdditionTask(digits=1, eval_size=2).eval_examples()) == 2
    with pytest.raises(ValueError, match="eval_size=256 is more than the held-out problems found at digits=1"):
        AdditionTask(digits=1).eval_examples()


def test_heavy_tail_lengths_follow_the_power_law_and_keep_the_held_out_pairs():
    task = HeavyTailAdditionTask(digits=24, tail=1.0)
    examples = task.train_examples(20_000, seed=0)
    lengths = Counter(len(x) for e in examples for x in operands(e))
    # P(L = l) ∝ l^-2: l=1 is 4x as likely as l=2 and 9x as l=3 (±10% sampling noise on 40 000 draws)
    assert lengths[1] / lengths[2] == pytest.approx(4, rel=0.1) and lengths[1] / lengths[3] == pytest.approx(9, rel=0.1)
    answers = sorted(len(e.answer) for e in examples)
    assert answers[len(answers) // 2] <= 2 and answers[-1] >= 20  # median short, tail long
    assert 0.03 < sum(n >= 12 for n in answers) / len(answers) < 0.1
    assert task.max_response_tokens == 26 and all(e.answer == str(sum(map(int, operands(e)))) for e in examples)
    held_out = {unordered(e) for e in task.eval_examples()}
    assert len(task.eval_examples()) == 256 and not held_out & {unordered(e) for e in examples}
    assert all(AdditionTask().is_held_out(*map(int, operands(e))) for e in task.eval_examples())  # the same pairs


def test_heavy_tail_options_are_checked_and_the_task_is_registered():
    assert isinstance(get_task("addition_heavy_tail", digits=8, tail=0.5), HeavyTailAdditionTask)
    for bad in (0, -1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="tail"):
            HeavyTailAdditionTask(tail=bad)
    with pytest.raises(ValueError, match="digits"):
        HeavyTailAdditionTask(digits=31)
