"""The machine record's CUDA MPS flag: step times of runs sharing a GPU depend on it."""

from benchmarks.machine import mps_running


def test_mps_is_running_exactly_when_its_control_pipe_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_running()
    (tmp_path / "control").touch()
    assert mps_running()
