"""The final answer of a free-form response (reasoning first, then the answer), for math word problems.

A response may mark its answer in one of the ways models are taught to (GSM8K's ``#### 18``, a LaTeX
``\\boxed{18}``, reasoning-gym's ``<answer>18</answer>``, or a sentence ``The answer is 18.``); the
last marked answer wins, in that order of preference. A response that marks nothing is read the way
"flexible" GSM8K evaluation reads it: its last number. Marked text like ``9 * 2 = $18`` yields the
number after the last ``=``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from nibble.tasks.matching import find_numbers, last_number

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# "The answer is 18", "Final answer: 18", "**Answer:** 18", "the answer is:\n18" (the next non-blank line).
# A lookahead, so that "the answer is 3. No: the answer is 4." yields both; a sentence ends the answer.
_PHRASE = re.compile(r"(?=\banswer\b\**[ \t]*(?:is\b[ \t]*:?|:)\**\s*([^\n]*))", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*?)\s*\}\s*\{\s*([^{}]*?)\s*\}")
_OPENERS = ("$", "\\(", "\\[", "*", "`")
_CLOSERS = ("$", "\\)", "\\]", "*", "`", ".")


@dataclass(frozen=True)
class FinalAnswer:
    """The answer found in a response.

    ``text``: the marked answer (wrappers such as ``$``, ``**`` and a closing period removed), or the
    last number's digits when nothing was marked. ``how``: ``"tag"``, ``"boxed"``, ``"hashes"``,
    ``"phrase"`` or ``"last_number"``. ``number``: the answer as an exact number, ``None`` when the
    marked text holds none.
    """

    text: str
    how: str
    number: Fraction | None


def extract_answer(response: str) -> FinalAnswer | None:
    """The final answer of ``response``, or ``None`` when it marks no answer and holds no number."""
    for how, find in (("tag", _last_tag), ("boxed", last_boxed), ("hashes", _last_hashes), ("phrase", _last_phrase)):
        text = find(response)
        if text is not None:
            text = _unwrap(text)
            return FinalAnswer(text=text, how=how, number=_number_of(text))
    number = last_number(response)
    return None if number is None else FinalAnswer(text=canonical_number(number), how="last_number", number=number)


def canonical_number(value: Fraction) -> str:
    """``value`` written plainly: ``"18"``, ``"-2.5"``, or ``"1/3"`` when no finite decimal equals it."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    scaled = abs(value.numerator * 10**digits // value.denominator)
    whole, fraction = divmod(scaled, 10**digits)
    return f"{'-' if value < 0 else ''}{whole}.{fraction:0{digits}d}"


def _last_tag(response: str) -> str | None:
    matches = _TAG.findall(response)
    return matches[-1] if matches else None


def last_boxed(response: str) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces balance."""
    for match in reversed(list(_BOXED.finditer(response))):
        depth, start = 1, match.end()
        for position in range(start, len(response)):
            depth += {"{": 1, "}": -1}.get(response[position], 0)
            if depth == 0:
                return response[start:position]
    return None


def _last_hashes(response: str) -> str | None:
    matches = [m for m in _HASHES.findall(response) if m.strip()]
    return matches[-1] if matches else None


def _last_phrase(response: str) -> str | None:
    matches = [_SENTENCE_END.split(m, 1)[0] for m in _PHRASE.findall(response)]
    matches = [m for m in matches if m.strip()]
    return matches[-1] if matches else None


def _unwrap(text: str) -> str:
    text = text.strip()
    while text and (stripped := _strip_once(text)) != text:
        text = stripped
    return text


def _strip_once(text: str) -> str:
    for opener in _OPENERS:
        text = text.removeprefix(opener)
    for closer in _CLOSERS:
        text = text.removesuffix(closer)
    return text.strip()


def _number_of(text: str) -> Fraction | None:
    """The number a marked answer states: after its last ``=`` when it shows working, else its first."""
    plain = _FRAC.sub(r"(\1)/(\2)", text.replace("{,}", ",")).replace("(", "").replace(")", "")
    for part in (plain.rsplit("=", 1)[-1], plain):
        numbers = find_numbers(part)
        if numbers:
            return numbers[0]
    return None
