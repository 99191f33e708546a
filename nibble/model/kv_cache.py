"""A static KV cache for batched incremental decoding."""

from __future__ import annotations

import torch

from nibble.model.config import ModelConfig


class KVCache:
    """Keys and values of every layer, preallocated: ``[B, kv_heads, max_len, head_dim]`` each.

    All rows advance together (prompts are left-padded), so one integer ``length`` says how many
    positions are filled; ``key_mask`` bool ``[B, max_len]`` marks the real (non-pad) keys.
    """

    def __init__(self, config: ModelConfig, batch: int, max_len: int, *, dtype: torch.dtype, device=None):
        shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.key_mask = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.length = 0
        self.max_len = max_len

    def reset(self) -> None:
        """Forget every position, keeping the buffers (a new batch of prompts reuses them)."""
        self.length = 0
        self.key_mask.zero_()

    def reserve(self, valid: torch.Tensor) -> None:
        """Claim the next ``T`` positions; ``valid`` bool ``[B, T]`` marks which are real tokens.

        Raises:
            ValueError: when the cache would overflow ``max_len``.
        """
        t = valid.shape[1]
        if self.length + t > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; {self.length} used, {t} more asked")
        self.key_mask[:, self.length : self.length + t] = valid

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, kvh, T, hd]`` at the reserved positions; return all keys/values so far."""
        end = self.length + k.shape[2]
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, t: int) -> None:
        self.length += t


class StaticKVCache:
    """One-token decode steps over a :class:`KVCache`'s buffers with static shapes (CUDA-graph capturable).

    The write position is the int64 device tensor ``index`` ``[1]``, not a Python int: each step writes its
    keys/values at ``index`` and :meth:`update` returns all ``max_len`` positions, so every step has the same
    shapes and reads nothing back to the host. The caller's attention mask hides positions not yet written.
    """

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.index = torch.zeros(1, dtype=torch.long, device=cache.key_mask.device)

    def reserve(self, valid: torch.Tensor) -> None:
        """Mark the step's position real (``valid`` bool ``[B]``) or padding in ``key_mask``."""
        self.cache.key_mask.index_copy_(1, self.index, valid.unsqueeze(1))

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, kvh, 1, hd]`` at ``index``; return the layer's whole ``[B, kvh, max_len, hd]`` buffers."""
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys.index_copy_(2, self.index, k)
        values.index_copy_(2, self.index, v)
        return keys, values

    def advance(self) -> None:
        self.index += 1
