"""Weight-stream frames: serialised ``WeightStreamItem`` messages, built and read without copying chunk data.

A weight stream moves gigabytes in 4 MiB chunks, and every copy of a chunk's bytes costs as much as
the network itself on loopback. Protobuf copies a ``bytes`` field when a message is built, when it is
serialised, when it is parsed, and again on every read of the field; the helpers here touch the
chunk's bytes only where they must be: the sender writes a small prefix and then the data as it lies
in the tensors; the receiver reads the prefix and keeps the data as a view into the received frame.
Frames are ordinary protobuf encodings: any protobuf implementation can read them, and
:func:`read_frame` reads whatever a protobuf implementation writes (falling back to it for encodings
other than the plain one).
"""

from __future__ import annotations

from dataclasses import dataclass

from nibble.wire import pb

_VARINT, _LENGTH_DELIMITED = 0, 2  # protobuf wire types
_ITEM_CHUNK_KEY = 2 << 3 | _LENGTH_DELIMITED  # WeightStreamItem.chunk: field 2
_CHUNK_DATA_KEY = 3 << 3 | _LENGTH_DELIMITED  # WeightChunk.data: field 3
_CHUNK_FIELDS = {1: _VARINT, 2: _VARINT, 3: _LENGTH_DELIMITED, 4: _LENGTH_DELIMITED}  # WeightChunk's, by number
_CHUNK_INT_LIMITS = {1: 2**64, 2: 2**32}  # policy_version is a uint64, index a uint32


@dataclass(frozen=True)
class ChunkFrame:
    """A ``WeightChunk`` read from its frame, with the fields of the message: ``data`` is a read-only
    view into the received frame (which it keeps alive), not a copy."""

    policy_version: int
    index: int
    data: memoryview
    checksum: str


def chunk_frame_prefix(version: int, index: int, checksum: str, size: int) -> bytes:
    """The bytes of a serialised ``WeightStreamItem`` holding a chunk, up to its ``size`` bytes of data:
    ``prefix + data`` is the whole message. Building messages this way copies the data once, where
    constructing and serialising a protobuf message copies it twice."""
    head = pb.WeightChunk(policy_version=version, index=index, checksum=checksum).SerializeToString()
    head += bytes([_CHUNK_DATA_KEY]) + _varint(size)
    return bytes([_ITEM_CHUNK_KEY]) + _varint(len(head) + size) + head


def pass_frames(message: pb.WeightStreamItem | bytes) -> bytes:
    """A gRPC serializer for weight streams: serialised messages (frames) pass through as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def read_frame(frame: bytes) -> pb.WeightStreamItem | ChunkFrame:
    """A gRPC deserializer for weight streams: a chunk as a :class:`ChunkFrame` (its data not copied),
    anything else — the manifest, or a chunk encoded unusually (fields repeated as groups, trailing
    fields after the chunk) — as the ``WeightStreamItem`` protobuf parses.

    Raises:
        google.protobuf.message.DecodeError: ``frame`` is not a ``WeightStreamItem``.
    """
    chunk = _chunk_of(memoryview(frame).toreadonly())
    return chunk if chunk is not None else pb.WeightStreamItem.FromString(frame)


def _chunk_of(frame: memoryview) -> ChunkFrame | None:
    """The chunk when ``frame`` is exactly one ``WeightStreamItem.chunk`` field of well-formed
    ``WeightChunk`` fields (last occurrence wins, unknown varint/length-delimited fields skipped, as
    protobuf reads them); ``None`` for anything else, which protobuf then judges."""
    end = len(frame)
    try:
        key, pos = _read_varint(frame, 0)
        length, pos = _read_varint(frame, pos)
        if key != _ITEM_CHUNK_KEY or pos + length != end:
            return None
        fields: dict[int, int | memoryview] = {}
        while pos < end:
            key, pos = _read_varint(frame, pos)
            number, wire = key >> 3, key & 7
            if not 0 < number < 2**29:
                return None  # not a valid field number
            if wire == _VARINT:
                value, pos = _read_varint(frame, pos)
            elif wire == _LENGTH_DELIMITED:
                size, pos = _read_varint(frame, pos)
                if pos + size > end:
                    return None
                value, pos = frame[pos : pos + size], pos + size
            else:
                return None  # fixed-width or group fields: WeightChunk has none
            if number in _CHUNK_FIELDS:
                if _CHUNK_FIELDS[number] != wire or (wire == _VARINT and value >= _CHUNK_INT_LIMITS[number]):
                    return None
                fields[number] = value
        checksum = bytes(fields.get(4, b"")).decode()
    except (IndexError, UnicodeDecodeError):  # truncated varint, or a checksum that is no string
        return None
    return ChunkFrame(
        policy_version=fields.get(1, 0), index=fields.get(2, 0), data=fields.get(3, frame[0:0]), checksum=checksum
    )


def _read_varint(frame: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; raises ``IndexError`` when it runs off the end
    or past 10 bytes (the longest protobuf writes)."""
    value = shift = 0
    for _ in range(10):
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise IndexError("varint longer than 10 bytes")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
