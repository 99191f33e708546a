"""Weight-stream frames: the zero-copy reader agrees with protobuf on every encoding it accepts."""

import random

import pytest
import torch
from google.protobuf.message import DecodeError

from nibble.transport.weights.frames import ChunkFrame, read_frame
from nibble.transport.weights.payload import stream_frames
from nibble.wire import pb


def frames(chunk_bytes: int = 48) -> list[bytes]:
    state = {"w": torch.arange(40, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    return list(stream_frames(7, state, "{}", chunk_bytes=chunk_bytes))


def content(item: pb.WeightStreamItem | ChunkFrame) -> tuple:
    """What a reader sees: the chunk's four fields, or the message when it holds no chunk (unknown
    fields, which protobuf keeps and compares, are no part of it)."""
    if isinstance(item, pb.WeightStreamItem):
        if item.WhichOneof("item") != "chunk":
            return ("message", item.SerializeToString())
        item = item.chunk
    return ("chunk", item.policy_version, item.index, bytes(item.data), item.checksum)


def test_chunks_come_back_as_views_of_the_frame_and_the_manifest_as_a_message():
    manifest, *chunks = frames()
    assert read_frame(manifest) == pb.WeightStreamItem.FromString(manifest)
    for index, frame in enumerate(chunks):
        item = read_frame(frame)
        assert isinstance(item, ChunkFrame) and (item.policy_version, item.index) == (7, index)
        assert item.data.obj is frame and item.data.readonly  # a view into the received bytes, not a copy
        assert content(item) == content(pb.WeightStreamItem.FromString(frame))


def test_other_encodings_of_a_chunk_read_as_protobuf_reads_them():
    reordered = b"".join(  # fields in reverse order, an unknown varint and string field, a repeated index
        [
            pb.WeightChunk(checksum="c").SerializeToString(),
            bytes([9 << 3 | 0, 5]),
            bytes([10 << 3 | 2, 1]) + b"z",
            pb.WeightChunk(data=b"abc", index=1).SerializeToString(),
            pb.WeightChunk(index=2, policy_version=3).SerializeToString(),
        ]
    )
    encoded = bytes([2 << 3 | 2, len(reordered)]) + reordered
    expected = ("chunk", 3, 2, b"abc", "c")
    assert content(pb.WeightStreamItem.FromString(encoded)) == expected  # protobuf's reading: last one wins
    assert content(read_frame(encoded)) == expected
    empty = pb.WeightStreamItem(chunk=pb.WeightChunk()).SerializeToString()
    assert content(read_frame(empty)) == content(pb.WeightStreamItem.FromString(empty))


def test_garbage_raises_decode_error_like_protobuf():
    with pytest.raises(DecodeError):
        read_frame(b"\x12\x05ab")  # a chunk field longer than the frame


def test_mutated_frames_read_as_protobuf_reads_them_or_fail_as_it_does():
    rng = random.Random(0)
    base = frames(chunk_bytes=16)[1]
    for _ in range(3000):
        frame = bytearray(base[: rng.randint(1, len(base))] if rng.random() < 0.3 else base)
        for _ in range(rng.randint(1, 3)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        frame = bytes(frame)
        try:
            expected = pb.WeightStreamItem.FromString(frame)
        except DecodeError:
            with pytest.raises(DecodeError):
                read_frame(frame)
            continue
        assert content(read_frame(frame)) == content(expected), frame.hex()
