"""Final answers read from free-form responses: each way of marking one, preference among them, numbers."""

from fractions import Fraction

import pytest

from nibble.tasks.answers import canonical_number, extract_answer


@pytest.mark.parametrize(
    ("response", "how", "text", "number"),
    [
        ("Janet sells 9 eggs. 9 * 2 = 18\n#### 18", "hashes", "18", 18),
        ("So the total is $\\boxed{1{,}250}$.", "boxed", "1{,}250", 1250),
        ("We get \\boxed{\\frac{3}{4}} of the cake.", "boxed", "\\frac{3}{4}", Fraction(3, 4)),
        ("<think>5+4</think><answer> 9 </answer>", "tag", "9", 9),
        ("First 3 + 4 = 7, so the answer is 7.", "phrase", "7", 7),
        ("**Answer:** $-12.50", "phrase", "-12.50", Fraction(-25, 2)),
        ("The final answer is: 9 * 2 = 18 dollars.", "phrase", "9 * 2 = 18 dollars", 18),
        ("The answer is:\n\n42", "phrase", "42", 42),
        ("He has 3 apples and buys 4 more, 7 in all.", "last_number", "7", 7),
        ("The answer is unclear from the text.", "phrase", "unclear from the text", None),
    ],
)
def test_each_way_of_marking_an_answer(response, how, text, number):
    found = extract_answer(response)
    assert (found.how, found.text, found.number) == (how, text, number)


def test_the_last_marked_answer_wins_and_stronger_marks_beat_phrases():
    assert extract_answer("The answer is 3. Wait, no: the answer is 4.").number == 4
    assert extract_answer("\\boxed{5} ... \\boxed{6}").number == 6
    assert extract_answer("The answer is 3.\n#### 8").number == 8
    assert extract_answer("<answer>2</answer> and \\boxed{9}").number == 2


@pytest.mark.parametrize("response", ["", "I do not know.", "\\boxed{", "The answer is"])
def test_a_response_without_answer_or_number_gives_none(response):
    assert extract_answer(response) is None


@pytest.mark.parametrize(
    ("value", "text"),
    [(Fraction(18), "18"), (Fraction(-5, 2), "-2.5"), (Fraction(1, 40), "0.025"), (Fraction(1, 3), "1/3")],
)
def test_canonical_numbers(value, text):
    assert canonical_number(value) == text
