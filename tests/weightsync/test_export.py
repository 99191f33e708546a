"""``weightsync.export_format``: every published version also lands on disk as an NVFP4 checkpoint
directory that engines load, holding the very bytes samplers fetch, before it is announced."""

import json

import pytest

from nibble.config import WeightSyncConfig
from nibble.interop import import_checkpoint
from nibble.model import tiny
from nibble.model.hf import write_config
from tests.nibble.interop.conftest import assert_same_state


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_each_version_is_exported_with_the_served_bytes_and_old_ones_pruned(layout, harness, trainer, state, tmp_path):
    _, plan = trainer
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_config(tiny(vocab_size=32), model_dir)
    (model_dir / "tokenizer.json").write_text("{}")
    server = harness.start(export_format=layout, export_model_dir=model_dir, keep_versions=2)
    seen = harness.watch(harness.subscriber(server))
    publisher = harness.publisher(server)
    for version in (1, 2, 3):
        publisher.publish(version, state, plan)
        exported = harness.store_dir / "export" / f"v{version:020d}"
        assert exported.is_dir()  # on disk before the trainer's reply (and the announcement)
    assert [seen.get(timeout=30) for _ in range(3)] == [1, 2, 3]
    assert sorted(p.name for p in (harness.store_dir / "export").iterdir()) == [f"v{v:020d}" for v in (2, 3)]

    _, served = harness.subscriber(server).fetch(3)
    back = import_checkpoint(exported)
    assert_same_state(back.state, dict(served))
    assert back.plan == plan
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and "quantization_config" in config
    assert (exported / "tokenizer.json").read_text() == "{}"


def test_the_export_directory_must_not_be_the_store(tmp_path):
    with pytest.raises(ValueError, match=r"export_dir must differ from weightsync\.store_dir"):
        WeightSyncConfig(store_dir=tmp_path, export_dir=tmp_path, export_format="modelopt")
