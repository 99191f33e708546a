"""Weights on the wire (docs/design.md §5): a state dict as one payload, a manifest, checksummed chunks.

The payload is the tensors' raw little-endian bytes, each tensor starting at a multiple of
:data:`ALIGNMENT` bytes (zero padding between them), so a receiver can view every tensor in place
without copying. Chunks of at most :data:`MAX_CHUNK_BYTES` follow the manifest in order, each with the
sha256 of its bytes as its checksum. The manifest names each tensor's dtype, shape and byte extent and
carries the digest of the whole payload: the sha256 of the chunks' sha256 digests (32 raw bytes each,
in chunk order) — a two-level hash list, which binds every byte of the payload as firmly as a sha256
over it, yet lets every side hash each byte once (hashing is the transfer's main cost; a separate
whole-payload sha256 doubled it). Nothing is pickled.

A :class:`WeightAssembler` is the receiving side: it returns the tensors only when every check passes
and otherwise raises :class:`WeightRejected`, whose ``reason`` is a short label for
``nibble_rejected_total{reason}``.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Iterable, Iterator

import torch

from nibble.kernels.tensors import NVFP4_FORMAT_VERSION
from nibble.transport.frames import ChunkFrame, chunk_frame_prefix
from nibble.wire import pb

MAX_CHUNK_BYTES = 4 * 1024 * 1024
"""Largest chunk payload (bytes): gRPC's default message limit (docs/design.md §5)."""

ALIGNMENT = 64
"""Byte alignment of every tensor's offset in the payload (a multiple of every element size)."""

DEFAULT_MAX_PAYLOAD_BYTES = 128 * 1024**3
"""Largest payload (bytes) an assembler accepts unless told otherwise; it allocates this much at once."""

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
    "float32": torch.float32,
}
"""The dtypes a payload may hold, by their wire name (torch's name without ``torch.``)."""

REASONS = (
    "no_manifest",
    "bad_manifest",
    "unsupported_dtype",
    "bad_extent",
    "oversize",
    "wrong_version",
    "out_of_order",
    "duplicate_chunk",
    "unknown_chunk",
    "bad_checksum",
    "missing_chunks",
    "digest_mismatch",
)
"""Every ``WeightRejected.reason`` the assembler raises (metric label values)."""

if sys.byteorder != "little":  # the payload is defined as little-endian; views would reinterpret bytes
    raise ImportError("nibble.transport.weights needs a little-endian host")


class WeightRejected(Exception):
    """A publication or fetch that failed verification; nothing of it may be applied.

    Attributes:
        reason: a short label from :data:`REASONS` (or a caller's own, e.g. ``"stale_version"``).
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of ``dtype``.

    Raises:
        ValueError: a dtype the payload format does not carry.
    """
    name = str(dtype).removeprefix("torch.")
    if DTYPES.get(name) is not dtype:
        raise ValueError(f"dtype {dtype} cannot travel as weights; supported: {', '.join(DTYPES)}")
    return name


def layout(state: dict[str, torch.Tensor]) -> tuple[list[pb.TensorMeta], int]:
    """Each tensor's entry (offset aligned to :data:`ALIGNMENT`) and the payload's total size (bytes).

    Raises:
        ValueError: naming a tensor of an unsupported dtype.
    """
    metas, offset = [], 0
    for name, tensor in state.items():
        try:
            dtype = dtype_name(tensor.dtype)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
        offset = -(-offset // ALIGNMENT) * ALIGNMENT
        nbytes = tensor.numel() * tensor.element_size()
        metas.append(pb.TensorMeta(name=name, dtype=dtype, shape=list(tensor.shape), offset=offset, nbytes=nbytes))
        offset += nbytes
    return metas, offset


def chunk_views(
    state: dict[str, torch.Tensor], metas: list[pb.TensorMeta], chunk_bytes: int = MAX_CHUNK_BYTES
) -> Iterator[list[memoryview]]:
    """The payload cut into chunks of ``chunk_bytes`` (the last one shorter), each as a list of
    zero-copy views of the tensors' bytes and of zero padding. Tensors must be on the CPU."""
    check_chunk_bytes(chunk_bytes)
    pending: list[memoryview] = []
    filled = 0
    for piece in _pieces(state, metas):
        while piece.nbytes:
            take = min(piece.nbytes, chunk_bytes - filled)
            pending.append(piece[:take])
            piece, filled = piece[take:], filled + take
            if filled == chunk_bytes:
                yield pending
                pending, filled = [], 0
    if pending:
        yield pending


def encode(
    state: dict[str, torch.Tensor],
    *,
    version: int,
    plan: str,
    quantized: bool,
    chunk_bytes: int = MAX_CHUNK_BYTES,
    on_chunk: Callable[[int, list[memoryview], str], object] | None = None,
) -> tuple[pb.WeightManifest, list[str]]:
    """One pass over ``state``'s bytes: the manifest and each chunk's checksum (sha256 hex); the
    manifest's digest is the sha256 of the chunks' raw sha256 digests (see the module's docstring).

    Args:
        state: CPU tensors by name, in payload order; they must not change until streamed.
        version: the policy version (≥ 1).
        plan: the precision plan as JSON (``PrecisionPlan.model_dump_json()``).
        quantized: whether ``state`` is weight-sync's quantised form.
        chunk_bytes: chunk size (bytes), at most :data:`MAX_CHUNK_BYTES`.
        on_chunk: called with each chunk's index, views (see :func:`chunk_views`) and checksum, in order
            (e.g. to write :func:`chunk_frame_prefix` and the views to a file).
    Raises:
        ValueError: an unsupported dtype or chunk size.
    """
    metas, total = layout(state)
    whole = hashlib.sha256()
    checksums = []
    for index, views in enumerate(chunk_views(state, metas, chunk_bytes)):
        chunk = hashlib.sha256()
        for view in views:
            chunk.update(view)
        whole.update(chunk.digest())
        checksums.append(chunk.hexdigest())
        if on_chunk is not None:
            on_chunk(index, views, checksums[-1])
    manifest = pb.WeightManifest(
        policy_version=version,
        tensors=metas,
        chunk_count=len(checksums),
        total_bytes=total,
        digest=whole.hexdigest(),
        plan=plan,
        quantized=quantized,
        format_version=NVFP4_FORMAT_VERSION if quantized else 0,
    )
    return manifest, checksums


def stream_frames(
    version: int,
    state: dict[str, torch.Tensor],
    plan: str,
    *,
    quantized: bool = False,
    chunk_bytes: int = MAX_CHUNK_BYTES,
) -> Iterator[bytes]:
    """The stream of one version as serialised ``WeightStreamItem`` messages: the manifest, then every
    chunk in order (see :func:`encode`). Each chunk's bytes are copied once, into its message.

    The bytes are read twice (checksums first, because the manifest leads).
    """
    state = {name: _cpu(tensor) for name, tensor in state.items()}
    manifest, checksums = encode(state, version=version, plan=plan, quantized=quantized, chunk_bytes=chunk_bytes)
    yield pb.WeightStreamItem(manifest=manifest).SerializeToString()
    for index, views in enumerate(chunk_views(state, list(manifest.tensors), chunk_bytes)):
        size = sum(view.nbytes for view in views)
        yield b"".join([chunk_frame_prefix(version, index, checksums[index], size), *views])


def stream_items(
    version: int,
    state: dict[str, torch.Tensor],
    plan: str,
    *,
    quantized: bool = False,
    chunk_bytes: int = MAX_CHUNK_BYTES,
) -> Iterator[pb.WeightStreamItem]:
    """The stream of one version as messages: the manifest first, then every chunk in order."""
    for frame in stream_frames(version, state, plan, quantized=quantized, chunk_bytes=chunk_bytes):
        yield pb.WeightStreamItem.FromString(frame)


def check_chunk_bytes(chunk_bytes: int) -> None:
    """Raises ValueError unless ``1 ≤ chunk_bytes ≤ MAX_CHUNK_BYTES``."""
    if not 1 <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes={chunk_bytes} must be between 1 and {MAX_CHUNK_BYTES} (4 MiB)")


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
        :func:`~nibble.transport.frames.read_frame` gives it."""
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


def _cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().contiguous()


def _pieces(state: dict[str, torch.Tensor], metas: list[pb.TensorMeta]) -> Iterator[memoryview]:
    """The payload in order: zero padding before each tensor's offset, then its bytes (no copies)."""
    end = 0
    for meta in metas:
        if meta.offset > end:
            yield memoryview(bytes(meta.offset - end))
        tensor = state[meta.name]
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError(f"{meta.name}: weights must be contiguous CPU tensors to stream")
        if meta.nbytes:
            yield memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")
        end = meta.offset + meta.nbytes
