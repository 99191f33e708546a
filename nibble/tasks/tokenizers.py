"""Tokenizers: a small interface, a character tokenizer for synthetic tasks, and Hugging Face's ``tokenizer.json``.

Token ids are plain Python ints. ``encode`` never adds special tokens and ``decode`` never strips
them: callers (SFT, sampler) place ``bos``/``eos`` themselves and cut a response at ``eos`` before
decoding it, so both sides agree on exactly which ids a sequence holds.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")

# Tried in order when neither the constructor nor the config files name the token. BERT-style
# tokenizers have no eos/bos: their [SEP]/[CLS] play that part.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>", "[SEP]")
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>", "[CLS]")
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>")
CONFIG_FALLBACK = {"eos_token": "sep_token", "bos_token": "cls_token"}


class Tokenizer(ABC):
    """Text ↔ token ids. Subclasses set ``vocab_size``, ``pad_id``, ``bos_id`` and ``eos_id`` (ints)."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are written out, nothing is stripped or stopped at."""


class CharTokenizer(Tokenizer):
    """One id per character of ``alphabet`` (in its order, from 3), after ``<pad>``=0, ``<bos>``=1, ``<eos>``=2.

    Raises:
        ValueError: ``alphabet`` is empty, not a string, or repeats a character.
    """

    def __init__(self, alphabet: str):
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
        for position, char in enumerate(alphabet):
            if alphabet.index(char) != position:
                raise ValueError(
                    f"alphabet repeats the character {char!r} (at positions {alphabet.index(char)} and {position})"
                )
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.vocab_size = len(SPECIAL_TOKENS) + len(alphabet)
        self._ids = {char: len(SPECIAL_TOKENS) + i for i, char in enumerate(alphabet)}
        self._tokens = (*SPECIAL_TOKENS, *alphabet)

    def encode(self, text: str) -> list[int]:
        """Raises ``ValueError`` naming the first character outside the alphabet and its position."""
        try:
            return [self._ids[char] for char in text]
        except KeyError:
            position = next(i for i, char in enumerate(text) if char not in self._ids)
            raise ValueError(
                f"character {text[position]!r} at position {position} of {text!r} "
                f"is not in the alphabet {self.alphabet!r}"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids decode to their names (``<eos>`` …). Raises ``ValueError`` on an id outside the vocabulary."""
        out = []
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(
                    f"token id {token_id} at position {position} is outside the vocabulary [0, {self.vocab_size})"
                )
            out.append(self._tokens[token_id])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharTokenizer({self.alphabet!r})"


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` (fast tokenizer), loaded offline with the ``tokenizers`` library.

    ``path`` is the ``tokenizer.json`` file or the directory holding it. Special tokens come, in order,
    from the ``eos_token``/``bos_token``/``pad_token`` arguments, from ``tokenizer_config.json`` and
    ``special_tokens_map.json`` beside the file (``sep_token``/``cls_token`` standing in for a missing
    eos/bos, as in BERT), and from well-known token names in the vocabulary. A missing bos falls back to
    eos, a missing pad to eos.

    Raises:
        ValueError: naming the file, when it is missing or not a valid tokenizer, when a named special
            token is not in its vocabulary, or when no eos token can be determined.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        eos_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
    ):
        from tokenizers import Tokenizer as _Backend

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"{file}: no such tokenizer file")
        try:
            self._backend = _Backend.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception on malformed files
            raise ValueError(f"{file}: not a valid Hugging Face tokenizer.json ({exc})") from exc
        self._backend.no_padding()  # a tokenizer.json may pad/truncate every encoding (MiniLM's pads to 128)
        self._backend.no_truncation()
        self.path = file
        self.vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        config = _special_tokens_config(file.parent)
        self.eos_id = self._special_id(file, "eos_token", eos_token, config, EOS_CANDIDATES)
        if self.eos_id is None:
            raise ValueError(
                f"{file}: cannot determine the eos token (no eos_token/sep_token in tokenizer_config.json or "
                f"special_tokens_map.json, none of {', '.join(EOS_CANDIDATES)} in the vocabulary); pass eos_token="
            )
        bos_id = self._special_id(file, "bos_token", bos_token, config, BOS_CANDIDATES)
        pad_id = self._special_id(file, "pad_token", pad_token, config, PAD_CANDIDATES)
        self.bos_id = self.eos_id if bos_id is None else bos_id
        self.pad_id = self.eos_id if pad_id is None else pad_id

    def _special_id(
        self, file: Path, field: str, explicit: str | None, config: dict[str, str], candidates: Sequence[str]
    ) -> int | None:
        if explicit is not None:
            token_id = self._backend.token_to_id(explicit)
            if token_id is None:
                raise ValueError(f"{file}: {field}={explicit!r} is not in the vocabulary")
            return token_id
        for name in (config.get(field), config.get(CONFIG_FALLBACK.get(field, "")), *candidates):
            if name is not None and (token_id := self._backend.token_to_id(name)) is not None:
                return token_id
        return None

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"


def _special_tokens_config(folder: Path) -> dict[str, str]:
    """``*_token`` entries of ``special_tokens_map.json`` then ``tokenizer_config.json`` (which wins).

    Values may be strings or ``{"content": ...}`` objects; unreadable files are ignored (they are optional).
    """
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        for key, value in data.items():
            if isinstance(value, dict):
                value = value.get("content")
            if key.endswith("_token") and isinstance(value, str):
                found[key] = value
    return found
