"""``python -m benchmarks.mismatch``: the record it writes, and what it refuses."""

import json

import pytest

from benchmarks.mismatch import main
from nibble.simulator import load


def test_a_run_configs_record_names_its_source_and_calibrates_the_floors(dense_run_config, tmp_path):
    out = tmp_path / "mismatch.json"
    main(["--config", str(dense_run_config), "--prompts", "4", "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["benchmark"] == "mismatch" and record["config"] == str(dense_run_config)
    assert (record["device"], record["quantize"], record["prompts"]) == ("cpu", "all_linear", 4)
    assert record["command"].startswith(".venv/bin/python -m benchmarks.mismatch --config ")
    assert len({r["plan"] for r in record["rows"]}) == 7
    calibration = load([out])
    assert "device cpu, prompts 4" in calibration.sources["floors.nvfp4"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "0"], "--prompts: 0 is not ≥ 1"),
        (["--prompts", "2.5"], "--prompts: '2.5' is not an integer"),
        (["--device", "tpu"], "--device='tpu' is not a device"),
        ([], None),  # --config and --checkpoint together
    ],
)
def test_bad_arguments_exit_2_before_any_work(dense_run_config, tmp_path, argv, message, capsys):
    out = tmp_path / "mismatch.json"
    extra = ["--checkpoint", str(tmp_path)] if message is None else []
    with pytest.raises(SystemExit) as exited:
        main(["--config", str(dense_run_config), *extra, *argv, "--out", str(out)])
    assert exited.value.code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "Traceback" not in err and (message is None or message in err)
