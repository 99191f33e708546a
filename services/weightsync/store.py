"""The versioned weight store on disk: each version's quantised payload, manifest and chunk checksums.

One directory per version, ``v<version, 20 digits>/`` holding ``manifest.pb`` (the serialised
``WeightManifest``), ``chunks.bin`` (every chunk as its serialised ``WeightStreamItem``, back to back,
so serving a chunk is one read and no re-encoding) and ``index.json`` (each chunk message's length
in bytes, the publication time). A version is written under a ``.tmp-*`` name, synced, and renamed into
place, so a crash leaves either the whole version or nothing. On start-up every held version is
verified again (a version whose bytes no longer match moves to ``.corrupt-*``, one quantised under older
NVFP4 numerics to ``.stale-format-*``; neither is served nor deleted), and only the last ``keep_versions``
are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from google.protobuf.message import DecodeError

from nibble.kernels.tensors import NVFP4_FORMAT_VERSION
from nibble.transport.weights.frames import chunk_frame_prefix
from nibble.transport.weights.payload import check_chunk_bytes, encode
from nibble.wire import pb

log = logging.getLogger(__name__)

MANIFEST, CHUNKS, INDEX = "manifest.pb", "chunks.bin", "index.json"
_VERSION_DIR = re.compile(r"^v(\d{20})$")


@dataclass(frozen=True)
class StoredVersion:
    """A complete, verified version on disk."""

    path: Path
    manifest: pb.WeightManifest
    frame_lengths: tuple[int, ...]  # bytes of each chunk's serialised message in chunks.bin
    published_at: float

    @property
    def version(self) -> int:
        return self.manifest.policy_version

    def announcement(self) -> pb.VersionAnnouncement:
        return pb.VersionAnnouncement(
            policy_version=self.version,
            digest=self.manifest.digest,
            total_bytes=self.manifest.total_bytes,
            published_at=self.published_at,
        )


class WeightStore:
    """Versions on disk under ``root``, newest last; thread-safe.

    Args:
        root: the store directory (created when missing).
        keep_versions: how many of the newest versions to keep (≥ 1).
    """

    def __init__(self, root: Path, keep_versions: int):
        if keep_versions < 1:
            raise ValueError(f"keep_versions={keep_versions} must be at least 1")
        self.root = Path(root)
        self.keep_versions = keep_versions
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        self._held: dict[int, StoredVersion] = self._load()
        self._prune()

    def latest(self) -> int:
        """The newest version held (0 when none)."""
        with self._lock:
            return max(self._held, default=0)

    def versions(self) -> list[int]:
        """Every version held, oldest first."""
        with self._lock:
            return sorted(self._held)

    def newest(self) -> StoredVersion | None:
        """The newest version held (``None`` when none)."""
        with self._lock:
            return self._held[max(self._held)] if self._held else None

    def announcements(self) -> list[pb.VersionAnnouncement]:
        """An announcement of every version held, oldest first."""
        with self._lock:
            return [self._held[v].announcement() for v in sorted(self._held)]

    def put(
        self, version: int, state: dict[str, torch.Tensor], *, plan: str, published_at: float, chunk_bytes: int
    ) -> StoredVersion:
        """Persist ``state`` (weight-sync's quantised form, CPU tensors) as ``version``, then drop versions
        beyond ``keep_versions``.

        Raises:
            ValueError: ``version`` is not above the newest held, or a tensor cannot travel as weights.
        """
        check_chunk_bytes(chunk_bytes)
        if version <= self.latest():
            raise ValueError(f"version {version} is not above the newest held ({self.latest()})")
        tmp = self.root / f".tmp-{_dirname(version)}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        lengths: list[int] = []
        try:
            with open(tmp / CHUNKS, "wb") as handle:

                def write(index: int, views: list[memoryview], checksum: str) -> None:
                    size = sum(view.nbytes for view in views)
                    prefix = chunk_frame_prefix(version, index, checksum, size)
                    handle.write(prefix)
                    for view in views:
                        handle.write(view)
                    lengths.append(len(prefix) + size)

                manifest, _ = encode(
                    state, version=version, plan=plan, quantized=True, chunk_bytes=chunk_bytes, on_chunk=write
                )
                _sync(handle)
            _write_synced(tmp / MANIFEST, manifest.SerializeToString())
            _write_synced(tmp / INDEX, json.dumps({"frame_lengths": lengths, "published_at": published_at}).encode())
            final = self.root / _dirname(version)
            os.rename(tmp, final)
            _sync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        stored = StoredVersion(final, manifest, tuple(lengths), published_at)
        with self._lock:
            self._held[version] = stored
        self._prune()
        return stored

    def open_stream(self, version: int) -> Iterator[bytes]:
        """The stream of ``version`` as serialised ``WeightStreamItem`` messages (manifest, then chunks
        read from disk). The file is opened now, so pruning the version meanwhile does not cut it short.

        Raises:
            KeyError: ``version`` is not held.
        """
        with self._lock:
            stored = self._held.get(version)
            if stored is None:
                raise KeyError(version)
            handle = open(stored.path / CHUNKS, "rb")  # noqa: SIM115 (closed by the generator)
        return _stream(stored, handle)

    def _prune(self) -> None:
        with self._lock:
            old = sorted(self._held)[: -self.keep_versions]
            dropped = [self._held.pop(v) for v in old]
        for stored in dropped:
            shutil.rmtree(stored.path, ignore_errors=True)
            log.info("dropped weight version %d (keeping the last %d)", stored.version, self.keep_versions)

    def _load(self) -> dict[int, StoredVersion]:
        held = {}
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(".tmp-"):
                shutil.rmtree(path, ignore_errors=True)  # an interrupted write
                continue
            if not _VERSION_DIR.match(path.name):
                continue
            try:
                stored = _verify(path)
            except (OSError, ValueError, KeyError, DecodeError) as exc:
                kind = "stale-format" if isinstance(exc, StaleFormat) else "corrupt"
                quarantine = self.root / f".{kind}-{path.name}-{int(time.time())}"
                log.warning("weight version in %s is not served (%s); moved to %s", path, exc, quarantine.name)
                os.rename(path, quarantine)
                continue
            held[stored.version] = stored
        if held:
            log.info("reloaded weight versions %s from %s", sorted(held), self.root)
        return held


class StaleFormat(ValueError):
    """A stored version quantised under other NVFP4 numerics than this build's (moved aside, not served)."""


def _dirname(version: int) -> str:
    return f"v{version:020d}"


def _verify(path: Path) -> StoredVersion:
    """Read a version directory back and check every chunk and the digest."""
    manifest = pb.WeightManifest.FromString((path / MANIFEST).read_bytes())
    index = json.loads((path / INDEX).read_text())
    stored = StoredVersion(path, manifest, tuple(int(n) for n in index["frame_lengths"]), float(index["published_at"]))
    if path.name != _dirname(stored.version) or len(stored.frame_lengths) != manifest.chunk_count:
        raise ValueError(f"holds version {stored.version} in {len(stored.frame_lengths)} chunks")
    if manifest.quantized and manifest.format_version != NVFP4_FORMAT_VERSION:
        raise StaleFormat(
            f"quantised under NVFP4 format {manifest.format_version}, this build serves format {NVFP4_FORMAT_VERSION}"
        )
    whole = hashlib.sha256()
    with open(path / CHUNKS, "rb") as handle:
        for number, frame in enumerate(_frames(stored, handle)):
            chunk = pb.WeightStreamItem.FromString(frame).chunk
            if (chunk.index, chunk.policy_version) != (number, stored.version):
                raise ValueError(f"chunk {number} holds chunk {chunk.index} of version {chunk.policy_version}")
            digest = hashlib.sha256(chunk.data).digest()
            if digest.hex() != chunk.checksum:
                raise ValueError(f"chunk {number} does not match its checksum")
            whole.update(digest)  # the manifest's digest is over the chunks' digests (nibble.transport.weights.payload)
        if handle.read(1):
            raise ValueError(f"{CHUNKS} is longer than its index")
    if whole.hexdigest() != manifest.digest:
        raise ValueError("the chunks do not match the manifest's digest")
    return stored


def _stream(stored: StoredVersion, handle: BinaryIO) -> Iterator[bytes]:
    with handle:
        yield pb.WeightStreamItem(manifest=stored.manifest).SerializeToString()
        yield from _frames(stored, handle)


def _frames(stored: StoredVersion, handle: BinaryIO) -> Iterator[bytes]:
    """Every chunk message of ``stored``, read from ``handle``.

    Raises:
        ValueError: the file ends early.
    """
    for index, length in enumerate(stored.frame_lengths):
        frame = handle.read(length)
        if len(frame) != length:
            raise ValueError(f"{stored.path / CHUNKS}: ends in chunk {index}")
        yield frame


def _sync(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        _sync(handle)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
