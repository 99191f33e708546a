"""The machine record's CUDA MPS flag (step times of runs sharing a GPU depend on it) and the results writer."""

import json
from pathlib import Path

import pytest

from benchmarks.machine import mps_running, write_record


def test_mps_is_running_exactly_when_its_control_pipe_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_running()
    (tmp_path / "control").touch()
    assert mps_running()


def test_write_record_creates_the_folder_writes_json_and_says_where(tmp_path, capsys):
    out = tmp_path / "new" / "folder" / "result.json"
    write_record(out, {"figure": 1.5, "rows": [1, 2]})
    assert json.loads(out.read_text()) == {"figure": 1.5, "rows": [1, 2]}
    assert out.read_text().endswith("}\n") and '\n  "figure"' in out.read_text()  # indent 2, a final newline
    assert capsys.readouterr().out == f"wrote {out}\n"
    write_record(out, {"figure": 2.0}, announce=False)  # an interim record of a run that rewrites it
    assert json.loads(out.read_text()) == {"figure": 2.0} and capsys.readouterr().out == ""


def test_write_record_converts_with_default_and_refuses_what_json_cannot_write(tmp_path):
    out = tmp_path / "result.json"
    write_record(out, {"path": Path("/x")}, indent=1, default=str)
    assert json.loads(out.read_text()) == {"path": "/x"}
    with pytest.raises(TypeError, match="not JSON serializable"):
        write_record(tmp_path / "other.json", {"path": Path("/x")})
    assert not (tmp_path / "other.json").exists()  # nothing half-written
