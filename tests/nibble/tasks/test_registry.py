"""Tasks by name: known names build their task, unknown names and options are named in the error."""

import pytest

from nibble.tasks import AdditionTask, JsonlTask, get_task
from tests.helpers import write_jsonl


def test_known_names_build_their_task_with_options(tmp_path):
    task = get_task("addition", digits=5, mixed_lengths=True)
    assert isinstance(task, AdditionTask) and task.digits == 5 and task.mixed_lengths
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": str(i), "answer": str(i)} for i in range(10)])
    assert isinstance(get_task("jsonl", path=path, eval_fraction=0.2), JsonlTask)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown task 'gsm8k'; known tasks: addition, addition_heavy_tail, jsonl, reasoning_gym"
    ):
        get_task("gsm8k")


def test_an_unknown_option_lists_the_task_options():
    with pytest.raises(ValueError, match="task 'addition' has no option 'digit'; its options: digits, mixed_lengths"):
        get_task("addition", digit=3)
