"""The versioned store on disk: atomic versions, pruning, reload after a restart, corrupt versions."""

import torch

from nibble.transport.weights import WeightAssembler
from nibble.weightsync.store import CHUNKS, WeightStore
from nibble.wire import pb

STATE = {
    "w::codes": torch.arange(200_000, dtype=torch.int32).view(torch.uint8),
    "b": torch.ones(7, dtype=torch.bfloat16),
}


def items(frames):
    return (pb.WeightStreamItem.FromString(frame) for frame in frames)


def put(store: WeightStore, version: int) -> None:
    store.put(version, STATE, plan="{}", published_at=float(version), chunk_bytes=64 * 1024)


def test_only_the_last_keep_versions_are_kept(tmp_path):
    store = WeightStore(tmp_path, keep_versions=2)
    for version in (1, 2, 5):
        put(store, version)
    assert store.versions() == [2, 5] and store.latest() == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"v{2:020d}", f"v{5:020d}"]


def test_versions_survive_a_restart_and_stream_the_same_bytes(tmp_path):
    put(WeightStore(tmp_path, keep_versions=3), 4)
    (tmp_path / ".tmp-v00000000000000000005-dead").mkdir()  # a write interrupted by a crash
    store = WeightStore(tmp_path, keep_versions=3)
    assert store.versions() == [4] and not (tmp_path / ".tmp-v00000000000000000005-dead").exists()
    manifest, tensors = WeightAssembler(version=4, quantized=True).assemble(items(store.open_stream(4)))
    assert torch.equal(tensors["w::codes"], STATE["w::codes"]) and torch.equal(tensors["b"], STATE["b"])
    assert store.announcements()[0].digest == manifest.digest
    assert WeightStore(tmp_path, keep_versions=1).versions() == [4]


def test_a_version_whose_bytes_changed_on_disk_is_not_served_after_a_restart(tmp_path):
    store = WeightStore(tmp_path, keep_versions=3)
    put(store, 1)
    put(store, 2)
    payload = tmp_path / f"v{2:020d}" / CHUNKS
    data = bytearray(payload.read_bytes())
    data[-100] ^= 0xFF
    payload.write_bytes(bytes(data))
    assert WeightStore(tmp_path, keep_versions=3).versions() == [1]
    assert any(p.name.startswith(".corrupt-v") for p in tmp_path.iterdir())


def test_a_stream_opened_before_pruning_still_completes(tmp_path):
    store = WeightStore(tmp_path, keep_versions=1)
    put(store, 1)
    stream = store.open_stream(1)
    put(store, 2)
    assert store.versions() == [2]
    _, tensors = WeightAssembler(version=1).assemble(items(stream))
    assert torch.equal(tensors["b"], STATE["b"])
