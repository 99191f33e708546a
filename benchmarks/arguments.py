"""Argument types the benchmarks' command lines share."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def integer_at_least(lowest: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= lowest``; anything else is refused naming the text given (argparse
    names the option), not as "invalid value" of a function's name."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{value} is not ≥ {lowest}")
        return value

    return parse
