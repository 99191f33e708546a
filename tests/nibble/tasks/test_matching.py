"""Built-in answer checks: exact match, and numeric match of the last number in a response."""

from fractions import Fraction

import pytest

from nibble.tasks.matching import exact_match, last_number, numeric_match, parse_number


def test_exact_match_ignores_surrounding_whitespace_only():
    assert exact_match("  42\n", "42 ") == 1.0
    assert exact_match("4 2", "42") == 0.0
    assert exact_match("42.0", "42") == 0.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("The answer is 42", "42"),
        ("so x = -5", "-5"),
        ("−5", "-5"),  # unicode minus
        ("it is 0.75", "3/4"),
        ("6/8", "3/4"),
        ("3 / 4", "0.75"),
        ("a total of 1,000 apples", "1000"),
        ("first 7, then 12.50", "12.5"),
        ("1000000.5", "1000000"),  # within 1e-6 relative
        (".5", "1/2"),
        ("x=(-1.5/2)", "-0.75"),
        ("0", "0"),
        ("10-3 = 7", "7"),
    ],
)
def test_numeric_match_accepts_equal_numbers(response, answer):
    assert numeric_match(response, answer) == 1.0


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("42, or maybe 43", "42"),  # the last number counts
        ("10-3", "-3"),  # subtraction, not a negative number
        ("5", "-5"),
        ("1000002", "1000000"),  # 2e-6 relative: outside the tolerance
        ("0.000001", "0"),  # zero matches only zero
        ("no number here", "1"),
        ("3/0", "3"),  # a zero denominator is no number
        ("", "0"),
        ("7", "seven"),  # an answer that is not a number never matches
    ],
)
def test_numeric_match_rejects_other_numbers_and_non_numbers(response, answer):
    assert numeric_match(response, answer) == 0.0


def test_parse_number_reads_a_whole_number_exactly():
    assert parse_number(" -12 ") == -12
    assert parse_number("3.50") == Fraction(7, 2)
    assert parse_number("1,234,567") == 1234567
    assert parse_number("-1/3") == Fraction(-1, 3)
    assert parse_number("12 apples") is None
    assert parse_number("1/0") is None
    assert last_number("between 1 and 2") == 2
    assert last_number("nothing") is None
