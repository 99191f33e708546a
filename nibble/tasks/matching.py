"""Built-in answer checks: exact string match and numeric match of the last number in a response."""

from __future__ import annotations

import re
from fractions import Fraction

NUMERIC_REL_TOL = Fraction(1, 10**6)

# A number: optional sign (a '-' right after a word character or ')' is subtraction, not a sign),
# digits with optional thousands separators and decimals, optionally '/' and a second such number.
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
_NUMBER = re.compile(rf"(?:(?<![\w)\]])[-−])?(?:{_UNSIGNED})(?:\s*/\s*(?:{_UNSIGNED}))?")


def exact_match(response: str, answer: str) -> float:
    """1.0 when ``response`` equals ``answer`` after stripping surrounding whitespace from both, else 0.0."""
    return 1.0 if response.strip() == answer.strip() else 0.0


def parse_number(text: str) -> Fraction | None:
    """``text`` (whole, stripped) as an exact number: ``"-12"``, ``"3.50"``, ``"1,000"``, ``"3/4"``, ``"-1.5/2"``.

    Returns ``None`` when it is not one such number, or is a fraction with a zero denominator.
    """
    text = text.strip()
    match = _NUMBER.fullmatch(text)
    return _to_fraction(match.group()) if match else None


def find_numbers(text: str) -> list[Fraction]:
    """Every number (as ``parse_number`` reads it) appearing in ``text``, in order; ``x/0`` is skipped."""
    return [value for token in _NUMBER.findall(text) if (value := _to_fraction(token)) is not None]


def last_number(text: str) -> Fraction | None:
    """The last number (as ``parse_number`` reads it) appearing anywhere in ``text``, or ``None``."""
    matches = _NUMBER.findall(text)
    return _to_fraction(matches[-1]) if matches else None


def numeric_match(response: str, answer: str) -> float:
    """1.0 when the last number in ``response`` equals the number ``answer`` within 1e-6 relative, else 0.0.

    Exact rational arithmetic: ``0.75``, ``3/4`` and ``6/8`` all match ``"3/4"``; zero matches only zero.
    """
    expected, got = parse_number(answer), last_number(response)
    if expected is None or got is None:
        return 0.0
    return 1.0 if abs(got - expected) <= NUMERIC_REL_TOL * max(abs(got), abs(expected)) else 0.0


def _to_fraction(token: str) -> Fraction | None:
    token = re.sub(r"[,\s]", "", token).replace("−", "-")
    numerator, _, denominator = token.partition("/")
    value = Fraction(numerator)
    if not denominator:
        return value
    divisor = Fraction(denominator)
    return value / divisor if divisor else None
