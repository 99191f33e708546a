"""Command-line pieces the benchmark scripts share."""

from __future__ import annotations

import argparse


def _integer_at_least(text: str, least: int, kind: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {kind} integer")
    return value


def positive(text: str) -> int:
    """An integer of at least 1 (counts: rows, steps, layers, repeats)."""
    return _integer_at_least(text, 1, "positive")


def non_negative(text: str) -> int:
    """An integer of at least 0."""
    return _integer_at_least(text, 0, "non-negative")


def fraction(text: str) -> float:
    """A number in [0, 1] (nan refused)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in [0, 1]")
    return value


class AddUp(argparse.Action):
    """A list option (``nargs="+"``) whose uses add up: ``--tiles a --tiles b`` is ``--tiles a b``, where
    argparse's ``store`` would silently keep only ``b``; the default stands only when the option is never given
    (argparse's own ``extend`` would add to it). A value given twice is refused: every list option here names
    things to run or skip, and a repeat would run one twice (or count it twice in a mean)."""

    def __init__(self, option_strings, dest, nargs="+", **kwargs):
        if nargs != "+":
            raise ValueError(f"{'/'.join(option_strings)}: AddUp takes nargs='+', not {nargs!r}")
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        earlier = [] if current is None or current is self.default else list(current)
        for i, value in enumerate(values):
            if value in earlier or value in values[:i]:
                raise argparse.ArgumentError(self, f"{value} given twice")
        setattr(namespace, self.dest, earlier + list(values))
