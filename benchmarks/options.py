"""Command-line pieces the benchmark scripts share."""

from __future__ import annotations

import argparse


class AddUp(argparse.Action):
    """A list option (``nargs="+"``) whose uses add up: ``--tiles a --tiles b`` is ``--tiles a b``, where
    argparse's ``store`` would silently keep only ``b``; the default stands only when the option is never given
    (argparse's own ``extend`` would add to it)."""

    def __init__(self, option_strings, dest, nargs="+", **kwargs):
        if nargs != "+":
            raise ValueError(f"{'/'.join(option_strings)}: AddUp takes nargs='+', not {nargs!r}")
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        earlier = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, earlier + list(values))
