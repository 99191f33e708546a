"""benchmarks/gemm_pipeline_gpu.py refuses what it cannot time before it looks for a GPU: tiles that make no
kernel or come twice, sources that are not CUDA files or share a name, a run with nothing left to time, and a
results path it could not write after the run."""

import sys

import pytest

pytest.importorskip("triton", reason="the triton package is not installed")

from benchmarks import gemm_pipeline_gpu


def _refused(monkeypatch, capsys, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["gemm_pipeline_gpu", *argv])
    with pytest.raises(SystemExit) as exit_info:
        gemm_pipeline_gpu.main()
    assert exit_info.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_input_is_refused_with_the_option_it_came_by(monkeypatch, capsys, tmp_path):
    source = tmp_path / "variant.cu"
    source.write_text("// a variant\n")
    (tmp_path / "other").mkdir()
    twin = tmp_path / "other" / "variant.cu"
    twin.write_text("// another\n")
    text = tmp_path / "notes.txt"
    text.write_text("not CUDA\n")
    cases = {
        ("--tiles", "2,7,8"): "whose ring fits",
        ("--tiles", "3,4,8"): "1 or 2 column groups",
        ("--tiles", "1,2,3"): "4 or 8 warps",
        ("--tiles", "2,x,8"): "GROUPS,STAGES,WARPS",
        ("--tiles", "2,4"): "GROUPS,STAGES,WARPS",
        ("--tiles", "2,4,8", "2,4,8"): "a tile given twice",
        ("--also", str(text)): "not a CUDA source",
        ("--also", str(source), str(twin)): "same file name",
        ("--against", str(tmp_path / "missing.cu")): "no such file",
        ("--skip", "dense", "grouped"): "nothing to time",
        ("--out", str(tmp_path)): "a directory",
        ("--out", str(tmp_path / "nowhere" / "r.json")): "its folder does not exist",
    }
    for argv, expected in cases.items():
        assert expected in _refused(monkeypatch, capsys, *argv), argv
