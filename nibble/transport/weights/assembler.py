"""The receiving side of weights on the wire (the format is :mod:`nibble.transport.weights.payload`'s).

A :class:`WeightAssembler` returns the tensors only when every check passes and otherwise raises
:class:`WeightRejected`, whose ``reason`` is a short label for ``nibble_rejected_total{reason}``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

import torch

from nibble.kernels.tensors import NVFP4_FORMAT_VERSION
from nibble.transport.weights.frames import ChunkFrame
from nibble.transport.weights.payload import DEFAULT_MAX_PAYLOAD_BYTES, DTYPES, MAX_CHUNK_BYTES
from nibble.wire import pb


class WeightRejected(Exception):
    """A publication or fetch that failed verification; nothing of it may be applied.

    Attributes:
        reason: a short label from :data:`nibble.monitoring.reasons.WEIGHT_REASONS` (or a caller's own, e.g.
            ``"stale_version"``).
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class WeightAssembler:
    """Rebuilds one version from its stream items, verifying everything on the way.

    Feed items with :meth:`add` (or all at once with :meth:`assemble`); :meth:`result` returns the
    manifest and the tensors (views of one buffer of ``total_bytes``) once all chunks arrived and the
    digest matches. Every failure raises :class:`WeightRejected`; an assembler that raised is spent.

    Args:
        max_bytes: largest acceptable payload (bytes); the buffer is allocated when the manifest arrives.
        version: the only acceptable policy version, or ``None`` for any.
        quantized: the required ``quantized`` flag, or ``None`` for either.
        buffer: a uint8 CPU tensor to receive into when it holds at least ``total_bytes`` (its start is
            used), e.g. the previous assembler's :attr:`buffer`: memory touched for the first time
            costs page faults that, on a virtual machine, take longer than receiving the bytes. Its
            contents are overwritten, so no tensor of an earlier result in it may still be in use.

    Attributes:
        buffer: the tensor received into, once the manifest arrived (to hand to the next assembler).

    Raises:
        ValueError: ``buffer`` is not a contiguous one-dimensional uint8 CPU tensor.
    """

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        version: int | None = None,
        quantized: bool | None = None,
        buffer: torch.Tensor | None = None,
    ):
        if buffer is not None and not (
            buffer.dtype == torch.uint8 and buffer.dim() == 1 and buffer.device.type == "cpu" and buffer.is_contiguous()
        ):
            raise ValueError(
                f"buffer must be a contiguous 1-D uint8 CPU tensor, got {buffer.dtype} {tuple(buffer.shape)}"
            )
        self.max_bytes = max_bytes
        self.version = version
        self.quantized = quantized
        self.manifest: pb.WeightManifest | None = None
        self.received_bytes = 0
        self.buffer = buffer
        self._next_index = 0
        self._buffer: torch.Tensor | None = None
        self._view: memoryview | None = None
        self._whole = hashlib.sha256()

    def assemble(
        self, items: Iterable[pb.WeightStreamItem | ChunkFrame]
    ) -> tuple[pb.WeightManifest, dict[str, torch.Tensor]]:
        """Consume every item, then return :meth:`result`."""
        for item in items:
            self.add(item)
        return self.result()

    def add(self, item: pb.WeightStreamItem | ChunkFrame) -> None:
        """Take one stream item (the manifest first, then chunks in order), as a message or as
        :func:`~nibble.transport.weights.frames.read_frame` gives it."""
        if isinstance(item, ChunkFrame):
            self._take_chunk(item)
            return
        kind = item.WhichOneof("item")
        if kind == "manifest":
            self._take_manifest(item.manifest)
        elif kind == "chunk":
            self._take_chunk(item.chunk)
        else:
            raise WeightRejected("bad_manifest", "a stream item holds neither a manifest nor a chunk")

    def result(self) -> tuple[pb.WeightManifest, dict[str, torch.Tensor]]:
        """The verified manifest and tensors, by name."""
        manifest = self.manifest
        if manifest is None:
            raise WeightRejected("no_manifest", "the stream ended before its manifest")
        if self._next_index != manifest.chunk_count or self.received_bytes != manifest.total_bytes:
            raise WeightRejected(
                "missing_chunks",
                f"version {manifest.policy_version}: received {self._next_index} of {manifest.chunk_count} chunks "
                f"({self.received_bytes} of {manifest.total_bytes} bytes)",
            )
        digest = self._whole.hexdigest()
        if digest != manifest.digest:
            raise WeightRejected(
                "digest_mismatch", f"version {manifest.policy_version}: payload digest {digest} != {manifest.digest}"
            )
        assert self._buffer is not None
        return manifest, {meta.name: _tensor_view(self._buffer, meta) for meta in manifest.tensors}

    def _take_manifest(self, manifest: pb.WeightManifest) -> None:
        if self.manifest is not None:
            raise WeightRejected("bad_manifest", "a second manifest in one stream")
        version = manifest.policy_version
        if self.version is not None and version != self.version:
            raise WeightRejected("wrong_version", f"manifest of version {version}, expected {self.version}")
        if self.quantized is not None and manifest.quantized != self.quantized:
            raise WeightRejected(
                "bad_manifest", f"version {version}: quantized={manifest.quantized}, expected {self.quantized}"
            )
        if manifest.quantized and manifest.format_version != NVFP4_FORMAT_VERSION:
            raise WeightRejected(
                "bad_manifest",
                f"version {version}: quantised under NVFP4 format {manifest.format_version}, this build reads "
                f"format {NVFP4_FORMAT_VERSION} (docs/design.md §2.2); re-publish it from the trainer",
            )
        if manifest.total_bytes > self.max_bytes:
            raise WeightRejected(
                "oversize", f"version {version}: {manifest.total_bytes} bytes exceed the limit of {self.max_bytes}"
            )
        _check_manifest(manifest)
        self.manifest = manifest
        total = manifest.total_bytes
        if self.buffer is None or self.buffer.numel() < total:
            self.buffer = torch.empty(total, dtype=torch.uint8)
        self._buffer = self.buffer[:total]
        self._view = memoryview(self._buffer.numpy()) if manifest.total_bytes else memoryview(b"")

    def _take_chunk(self, chunk: pb.WeightChunk | ChunkFrame) -> None:
        manifest = self.manifest
        if manifest is None:
            raise WeightRejected("no_manifest", f"chunk {chunk.index} arrived before the manifest")
        if chunk.policy_version != manifest.policy_version:
            raise WeightRejected(
                "wrong_version",
                f"chunk {chunk.index} of version {chunk.policy_version} in {manifest.policy_version}",
            )
        if chunk.index >= manifest.chunk_count:
            raise WeightRejected("unknown_chunk", f"chunk {chunk.index} beyond the manifest's {manifest.chunk_count}")
        if chunk.index < self._next_index:
            raise WeightRejected("duplicate_chunk", f"chunk {chunk.index} arrived twice")
        if chunk.index > self._next_index:
            raise WeightRejected("out_of_order", f"chunk {chunk.index} arrived where {self._next_index} was due")
        data = chunk.data  # read once: every read of a protobuf bytes field copies it
        size = len(data)
        if not 0 < size <= MAX_CHUNK_BYTES or self.received_bytes + size > manifest.total_bytes:
            raise WeightRejected(
                "oversize",
                f"chunk {chunk.index} of {size} bytes (at most {MAX_CHUNK_BYTES}; "
                f"{manifest.total_bytes - self.received_bytes} of the payload left)",
            )
        digest = hashlib.sha256(data).digest()
        if digest.hex() != chunk.checksum:
            raise WeightRejected("bad_checksum", f"chunk {chunk.index} of version {manifest.policy_version}")
        assert self._view is not None
        self._view[self.received_bytes : self.received_bytes + size] = data
        self._whole.update(digest)
        self.received_bytes += size
        self._next_index += 1


def _check_manifest(manifest: pb.WeightManifest) -> None:
    """Structural checks: chunk count vs size, digest form, and every tensor's dtype and extent."""
    version, total, count = manifest.policy_version, manifest.total_bytes, manifest.chunk_count
    if not -(-total // MAX_CHUNK_BYTES) <= count <= total:
        raise WeightRejected("bad_manifest", f"version {version}: {count} chunks cannot carry {total} bytes")
    if len(manifest.digest) != 64:
        raise WeightRejected("bad_manifest", f"version {version}: digest {manifest.digest!r} is not sha256 hex")
    names, end = set(), 0
    for meta in sorted(manifest.tensors, key=lambda m: m.offset):
        if meta.name in names or not meta.name:
            raise WeightRejected("bad_manifest", f"version {version}: tensor name {meta.name!r} empty or repeated")
        names.add(meta.name)
        dtype = DTYPES.get(meta.dtype)
        if dtype is None:
            raise WeightRejected("unsupported_dtype", f"{meta.name}: dtype {meta.dtype!r}")
        size = dtype.itemsize
        numel = math.prod(meta.shape) if all(d >= 0 for d in meta.shape) else -1
        if numel * size != meta.nbytes or meta.offset % size or meta.offset < end or meta.offset + meta.nbytes > total:
            raise WeightRejected(
                "bad_extent",
                f"{meta.name}: {meta.dtype} {list(meta.shape)} at bytes [{meta.offset}, {meta.offset + meta.nbytes}) "
                f"of a {total}-byte payload (misaligned, overlapping, outside it or of the wrong size)",
            )
        end = meta.offset + meta.nbytes


def _tensor_view(buffer: torch.Tensor, meta: pb.TensorMeta) -> torch.Tensor:
    raw = buffer[meta.offset : meta.offset + meta.nbytes]
    return raw.view(DTYPES[meta.dtype]).reshape(tuple(meta.shape))
