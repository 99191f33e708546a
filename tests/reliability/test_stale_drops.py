"""A group dropped as stale is dropped once: a trainer stopped while it reads the next step's groups keeps
the drops it made in its checkpoint's ``stale_dropped`` ledger and acknowledges their entries, so a resumed
trainer neither meets them again nor gives their admission slots back a second time."""

from __future__ import annotations

from nibble.trainer import checkpoint
from tests.reliability.conftest import InProcessTrainer, make_group, run_config


def test_a_stop_while_reading_keeps_the_stale_drops_and_a_resumed_trainer_does_not_redo_them(
    stream_config, writer, tmp_path
):
    config = run_config(stream_config, tmp_path, max_staleness=0)
    service = InProcessTrainer(config, tmp_path / "out")
    admission = service.admission
    commit = lambda pipe: admission.commit("s", pipe)  # noqa: E731 (as the sampler writes)
    assert admission.reserve(10, "s")
    writer.write(make_group("fresh", [[3, 2], [4, 5]]), also=commit)
    service.trainer.step()  # step 1: version 1 is out, so a version-0 group is now 1 version too old
    assert admission.reserve(10, "s")
    writer.write(make_group("old", [[3, 2], [4, 5]], version=0), also=commit)
    started = admission.started()

    read = service.trainer.reader.read

    def read_then_stop(*args, **kwargs):
        entries = read(*args, **kwargs)
        service.trainer.stop.set()  # SIGTERM while the next step's groups are being read
        return entries

    service.trainer.reader.read = read_then_stop
    assert service.trainer.run() is False

    assert service.metrics.value("nibble_stale_dropped_total") == 2
    assert admission.started() == started - 1  # the dropped group's slot came back
    state = checkpoint.load_state(checkpoint.latest(config.trainer.checkpoint_dir))
    assert state.step == 1 and {"old-0", "old-1"} <= set(state.stale_dropped)
    assert service.client.xpending(stream_config.stream, stream_config.consumer_group)["pending"] == 0

    again = InProcessTrainer(config, tmp_path / "out")
    assert admission.reserve(10, "s")
    writer.write(make_group("next", [[3, 2], [4, 5]], version=1), also=commit)
    again.trainer.step()
    assert again.trainer.ledger.ids()[-2:] == ["next-0", "next-1"]
    assert again.metrics.value("nibble_stale_dropped_total") == 0
    assert admission.started() == started  # one slot back for the drop, one taken for "next": none twice
