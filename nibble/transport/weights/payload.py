"""Weights on the wire (docs/design.md §5): a state dict as one payload, a manifest, checksummed chunks.

The payload is the tensors' raw little-endian bytes, each tensor starting at a multiple of
:data:`ALIGNMENT` bytes (zero padding between them), so a receiver can view every tensor in place
without copying. Chunks of at most :data:`MAX_CHUNK_BYTES` follow the manifest in order, each with the
sha256 of its bytes as its checksum. The manifest names each tensor's dtype, shape and byte extent and
carries the digest of the whole payload: the sha256 of the chunks' sha256 digests (32 raw bytes each,
in chunk order) — a two-level hash list, which binds every byte of the payload as firmly as a sha256
over it, yet lets every side hash each byte once (hashing is the transfer's main cost; a separate
whole-payload sha256 doubled it). Nothing is pickled.

This module is the sending side (layout, checksums, frames); the receiving side, which verifies all of
it, is :class:`nibble.transport.weights.assembler.WeightAssembler`.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator

import torch

from nibble.kernels.tensors import NVFP4_FORMAT_VERSION
from nibble.transport.weights.frames import chunk_frame_prefix
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

if sys.byteorder != "little":  # the payload is defined as little-endian; views would reinterpret bytes
    raise ImportError("nibble.transport.weights.payload needs a little-endian host")


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
