"""The process that runs a custom reward function: ``python -m nibble.tasks.reward_worker package.module:function``.

Protocol (JSON lines; nothing is pickled): after importing the function the worker writes
``{"ready": true}`` or ``{"error": "<why>"}`` and exits; then, per request line
``{"prompt": str, "response": str, "answer": str}``, it writes one line, either ``{"reward": float}``
(finite) or ``{"fail": "exception" | "non_finite" | "not_a_number", "detail": str}``. It exits at the
end of its input. The function's own prints go to stderr so they cannot corrupt the protocol.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import sys
from collections.abc import Callable
from typing import TextIO


def load_function(path: str) -> Callable[[str, str, str], object]:
    """The callable named by ``"package.module:function"`` (dots after the colon walk attributes).

    Raises:
        ValueError: the path is malformed, the module fails to import, or the attribute is missing or
            not callable.
    """
    module_name, colon, attribute = path.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"reward path {path!r} must look like 'package.module:function'")
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"reward path {path!r}: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from exc
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise ValueError(f"reward path {path!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, name)
    if not callable(target):
        raise ValueError(f"reward path {path!r}: {attribute!r} is not callable")
    return target


def score(function: Callable[[str, str, str], object], request: dict) -> dict:
    """Run ``function(prompt, response, answer)`` and classify the outcome as a protocol reply."""
    try:
        value = function(request["prompt"], request["response"], request["answer"])
    except Exception as exc:
        return {"fail": "exception", "detail": f"{type(exc).__name__}: {exc}"}
    if not isinstance(value, numbers.Real):
        return {"fail": "not_a_number", "detail": f"returned {type(value).__name__}"}
    try:
        value = float(value)
    except OverflowError:  # e.g. an int like 10**400
        return {"fail": "non_finite", "detail": "returned a number too large for a float"}
    if not math.isfinite(value):
        return {"fail": "non_finite", "detail": f"returned {value}"}
    return {"reward": value}


def serve(path: str, requests: TextIO, replies: TextIO) -> None:
    try:
        function = load_function(path)
    except ValueError as exc:
        replies.write(json.dumps({"error": str(exc)}) + "\n")
        return
    replies.write('{"ready": true}\n')
    for line in requests:
        replies.write(json.dumps(score(function, json.loads(line))) + "\n")


def main() -> None:
    # Keep private copies of the protocol pipes; point fds 0/1 at /dev/null and stderr.
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.argv[1], requests, replies)


if __name__ == "__main__":
    main()
