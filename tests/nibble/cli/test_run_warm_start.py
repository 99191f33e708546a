"""``nibble run``'s warm start: an existing checkpoint trained on another task is reported, not ignored."""

import io
import json

from rich.console import Console

from nibble.cli.run import _ensure_warm_start
from nibble.config import load


def existing_warm_start(path, task: dict | None):
    path.mkdir()
    (path / "config.json").write_text("{}")
    if task is not None:
        (path / "nibble_sft.json").write_text(json.dumps({"task": task}))
    return path


def said(config) -> str:
    out = io.StringIO()
    _ensure_warm_start(config, Console(file=out, width=400))
    return out.getvalue()


def test_a_warm_start_of_another_task_is_warned_about(tmp_path):
    checkpoint = existing_warm_start(tmp_path / "ckpt", {"name": "addition", "options": {"digits": 3}})
    config = load(None, {"NIBBLE_MODEL__CHECKPOINT": str(checkpoint)})
    assert "was trained on task" in said(config) and "digits': 3" in said(config)


def test_a_matching_or_foreign_warm_start_is_used_silently(tmp_path):
    config = load(None)
    task = {"name": config.task.name, "options": config.task.options}
    matching = existing_warm_start(tmp_path / "matching", task)
    assert said(load(None, {"NIBBLE_MODEL__CHECKPOINT": str(matching)})) == ""
    foreign = existing_warm_start(tmp_path / "foreign", None)  # no nibble_sft.json: not ours to judge
    assert said(load(None, {"NIBBLE_MODEL__CHECKPOINT": str(foreign)})) == ""
