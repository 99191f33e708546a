"""Reading tensors from safetensors files and directories (single files or HF-style shards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open


def safetensors_files(path: Path) -> list[Path]:
    """The safetensors files at ``path``: the file itself, or every ``*.safetensors`` in a directory.

    Raises:
        ValueError: the path does not exist, or a directory holds no ``*.safetensors`` file.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or directory")
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: directory holds no *.safetensors file")
    return files


def read_safetensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor under ``path`` (CPU tensors, stored dtype).

    Raises:
        ValueError: naming the file, when it is not a readable safetensors file.
    """
    for handle in _handles(path):
        for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
            yield name, handle.get_tensor(name)


def safetensors_shapes(path: Path) -> Iterator[tuple[str, list[int], str]]:
    """Yield ``(name, shape, dtype)`` for every tensor under ``path`` from the files' headers (nothing is
    loaded); ``dtype`` as safetensors spells it (``F32``, ``BF16``, ``I64``, …).

    Raises:
        ValueError: naming the file, when it is not a readable safetensors file.
    """
    for handle in _handles(path):
        for name in handle.keys():  # noqa: SIM118 (safe_open handles are not iterable)
            piece = handle.get_slice(name)
            yield name, list(piece.get_shape()), piece.get_dtype()


def _handles(path: Path) -> Iterator:
    """Each safetensors file under ``path`` opened in turn; a read error while the caller reads one (it
    surfaces at this ``yield``) is raised as a ValueError naming the file."""
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as handle:
                yield handle
        except (SafetensorError, OSError) as exc:
            raise ValueError(f"{file}: not a readable safetensors file ({exc})") from exc
