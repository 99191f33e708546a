"""Weights on the wire without a network: payload layout, chunking, and every way the assembler rejects."""

import hashlib

import pytest
import torch

from nibble.monitoring.reasons import WEIGHT_REASONS
from nibble.transport.weights.assembler import WeightAssembler, WeightRejected
from nibble.transport.weights.payload import ALIGNMENT, MAX_CHUNK_BYTES, layout, stream_items
from nibble.wire import pb


def every_dtype() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w.bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "w::codes": torch.randint(0, 256, (7, 3), generator=g, dtype=torch.uint8),
        "w::block_scales": torch.randn(2, 9, generator=g).to(torch.float8_e4m3fn),
        "m::block_scales": torch.randint(0, 255, (4,), generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        "w::global_scale": torch.tensor(0.125),
        "empty": torch.zeros(0, 4, dtype=torch.bfloat16),
        "f32": torch.randn(2, 2, 2, generator=g),
    }


def items_of(state, chunk_bytes=64, version=1, quantized=False) -> list[pb.WeightStreamItem]:
    return list(stream_items(version, state, '{"num_layers": 1}', quantized=quantized, chunk_bytes=chunk_bytes))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def test_every_dtype_round_trips_bit_exactly_with_aligned_offsets():
    state = every_dtype()
    manifest, tensors = WeightAssembler().assemble(items_of(state, chunk_bytes=40))
    assert list(tensors) == list(state)
    for name, tensor in state.items():
        assert tensors[name].dtype == tensor.dtype and tensors[name].shape == tensor.shape, name
        assert torch.equal(bits(tensors[name]), bits(tensor)), name
    assert all(meta.offset % ALIGNMENT == 0 for meta in manifest.tensors)
    assert manifest.chunk_count == -(-manifest.total_bytes // 40)
    assert manifest.plan == '{"num_layers": 1}' and not manifest.quantized


def test_each_checksum_is_sha256_of_its_chunk_and_the_digest_sha256_of_the_chunk_digests():
    items = items_of(every_dtype())
    chunks = [item.chunk for item in items[1:]]
    assert all(c.checksum == hashlib.sha256(c.data).hexdigest() for c in chunks)
    hash_list = b"".join(hashlib.sha256(c.data).digest() for c in chunks)
    assert items[0].manifest.digest == hashlib.sha256(hash_list).hexdigest()


def test_chunks_swapped_with_their_checksums_are_caught_by_the_digest():
    items = items_of(every_dtype())
    first, second = items[1].chunk, items[2].chunk
    first.data, second.data = second.data, first.data
    first.checksum, second.checksum = second.checksum, first.checksum
    assert reject(items) == "digest_mismatch"


def test_chunks_never_exceed_4_mib_and_the_chunk_size_is_bounded():
    state = {"big": torch.zeros(5 * MAX_CHUNK_BYTES // 4 + 3, dtype=torch.bfloat16)}  # 10 MiB + 6 bytes
    sizes = [len(item.chunk.data) for item in stream_items(1, state, "{}")][1:]
    assert sizes == [MAX_CHUNK_BYTES, MAX_CHUNK_BYTES, 2 * 1024 * 1024 + 6]
    small = [len(item.chunk.data) for item in stream_items(1, state, "{}", chunk_bytes=1 << 20)][1:]
    assert max(small) == 1 << 20 and len(small) == 11
    with pytest.raises(ValueError, match="4 MiB"):
        next(stream_items(1, state, "{}", chunk_bytes=MAX_CHUNK_BYTES + 1))


def test_unsupported_dtypes_are_refused_naming_the_tensor():
    with pytest.raises(ValueError, match=r"w64.*float64"):
        layout({"w64": torch.zeros(2, dtype=torch.float64)})


def reject(items, **assembler) -> str:
    with pytest.raises(WeightRejected) as info:
        WeightAssembler(**assembler).assemble(items)
    assert info.value.reason in WEIGHT_REASONS
    return info.value.reason


def with_chunk(items, index, **changes):
    out = list(items)
    chunk = pb.WeightChunk()
    chunk.CopyFrom(out[index].chunk)
    for key, value in changes.items():
        setattr(chunk, key, value)
    out[index] = pb.WeightStreamItem(chunk=chunk)
    return out


def with_manifest(items, edit):
    manifest = pb.WeightManifest()
    manifest.CopyFrom(items[0].manifest)
    edit(manifest)
    return [pb.WeightStreamItem(manifest=manifest), *items[1:]]


def test_each_corruption_is_rejected_with_its_reason():
    items = items_of(every_dtype())
    assert len(items) > 5
    flipped = bytes([items[2].chunk.data[0] ^ 1]) + items[2].chunk.data[1:]
    assert reject(with_chunk(items, 2, data=flipped)) == "bad_checksum"
    assert reject(with_manifest(items, lambda m: setattr(m, "digest", "0" * 64))) == "digest_mismatch"
    assert reject(items[:3] + items[4:]) == "out_of_order"
    assert reject(items[:-1]) == "missing_chunks"
    assert reject(items[:3] + items[2:]) == "duplicate_chunk"
    extra = pb.WeightChunk(policy_version=1, index=len(items) - 1, data=b"x", checksum=hashlib.sha256(b"x").hexdigest())
    assert reject([*items, pb.WeightStreamItem(chunk=extra)]) == "unknown_chunk"
    assert reject(with_chunk(items, 3, policy_version=2)) == "wrong_version"
    assert reject(items[1:]) == "no_manifest"
    assert reject([]) == "no_manifest"
    assert reject([items[0], *items]) == "bad_manifest"
    assert reject(items, version=2) == "wrong_version"
    assert reject(items, quantized=True) == "bad_manifest"
    assert reject(items, max_bytes=100) == "oversize"


def test_manifests_describing_impossible_payloads_are_rejected():
    items = items_of(every_dtype())

    def tensor_edit(**changes):
        def edit(manifest):
            for key, value in changes.items():
                setattr(manifest.tensors[0], key, value)

        return edit

    total = items[0].manifest.total_bytes
    assert reject(with_manifest(items, tensor_edit(offset=total - 8))) == "bad_extent"  # runs past the end
    assert reject(with_manifest(items, tensor_edit(nbytes=32))) == "bad_extent"  # disagrees with its shape
    assert reject(with_manifest(items, tensor_edit(offset=1))) == "bad_extent"  # misaligned for bf16
    assert reject(with_manifest(items, tensor_edit(offset=items[0].manifest.tensors[1].offset))) == "bad_extent"
    assert reject(with_manifest(items, tensor_edit(dtype="float64"))) == "unsupported_dtype"
    assert reject(with_manifest(items, tensor_edit(name="w::codes"))) == "bad_manifest"  # repeated name
    assert reject(with_manifest(items, lambda m: setattr(m, "chunk_count", 0))) == "bad_manifest"
    oversize_chunk = b"\0" * (MAX_CHUNK_BYTES + 1)
    assert (
        reject(with_chunk(items, 1, data=oversize_chunk, checksum=hashlib.sha256(oversize_chunk).hexdigest()))
        == "oversize"
    )


def test_received_tensors_are_views_of_one_buffer():
    state = {"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    _, tensors = WeightAssembler().assemble(items_of(state))
    assert tensors["a"].untyped_storage().data_ptr() == tensors["b"].untyped_storage().data_ptr()


def test_a_given_buffer_is_received_into_when_large_enough_and_replaced_when_not():
    state = {"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    roomy = torch.full((4096,), 7, dtype=torch.uint8)
    assembler = WeightAssembler(buffer=roomy)
    _, tensors = assembler.assemble(items_of(state))
    assert assembler.buffer is roomy and tensors["a"].untyped_storage().data_ptr() == roomy.data_ptr()
    assert torch.equal(tensors["a"], state["a"]) and torch.equal(tensors["b"], state["b"])
    small = torch.zeros(8, dtype=torch.uint8)
    assembler = WeightAssembler(buffer=small)
    _, tensors = assembler.assemble(items_of(state))
    assert assembler.buffer is not small and torch.equal(tensors["a"], state["a"])
    with pytest.raises(ValueError, match="uint8"):
        WeightAssembler(buffer=torch.zeros(8))
