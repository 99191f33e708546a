"""``nibble deadletter list|show|replay``: a poison entry is found, read, and — once its cause is fixed —
replayed and trained, with admission accounting kept exact."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from nibble.cli import deadletter  # noqa: F401  (registers the sub-command)
from nibble.cli.app import app
from tests.reliability.conftest import InProcessTrainer, make_group, run_config


def test_list_show_and_replay_after_the_cause_is_fixed(stream_config, writer, tmp_path):
    config = run_config(stream_config, tmp_path)
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"redis": stream_config.model_dump(mode="json")}))
    cli = CliRunner()
    service = InProcessTrainer(config, tmp_path / "out")  # a model of 15 tokens
    for name, tokens in (("poison", [[25, 2], [3, 4]]), ("good", [[3, 2], [4, 5]])):
        assert service.admission.reserve(10, "s")
        writer.write(make_group(name, tokens), also=lambda pipe: service.admission.commit("s", pipe))
    service.trainer.step()

    listed = cli.invoke(app, ["deadletter", "list", "--config", str(file)])
    assert listed.exit_code == 0, listed.output
    [line] = listed.stdout.splitlines()
    entry_id = line.split()[0]
    assert "token_out_of_vocab" in line and "poison-g" in line
    shown = cli.invoke(app, ["deadletter", "show", entry_id, "--config", str(file)])
    record = json.loads(shown.stdout)
    assert record["reason"].startswith("token_out_of_vocab") and record["group"]["responses"][0]["tokens"] == [25, 2]
    missing = cli.invoke(app, ["deadletter", "show", "1-1", "--config", str(file)])
    assert missing.exit_code == 2 and "no dead-letter entry '1-1'" in missing.output

    # the cause fixed (a model with a larger vocabulary), the entry goes back and is trained
    assert service.admission.started() == 1
    replayed = cli.invoke(app, ["deadletter", "replay", "--reason", "token_out_of_vocab", "--config", str(file)])
    assert replayed.exit_code == 0 and entry_id in replayed.stdout
    assert cli.invoke(app, ["deadletter", "list", "--config", str(file)]).stdout == ""
    assert service.admission.started() == 2  # the replayed group counts as written
    fixed = InProcessTrainer(config, tmp_path / "out", vocab=32)
    fixed.trainer.step()
    assert fixed.trainer.ledger.ids()[-2:] == ["poison-0", "poison-1"]
