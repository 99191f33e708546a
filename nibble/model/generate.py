"""Batched sampling with a KV cache, returning the sampler's logprob of every sampled token.

The logprob is ``log_softmax(logits / T)`` at the sampling temperature, before top-p renormalisation
(docs/design.md §4), so the trainer can score the same tokens with the same ``T`` and compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from nibble.model.kv_cache import KVCache
from nibble.model.transformer import MoETransformer
from nibble.recipe.compute import log_softmax


@dataclass(frozen=True)
class Generation:
    """Responses of one :func:`generate` call, one entry per prompt.

    ``tokens[i]`` includes the stop token when one ended the response; ``logprobs[i]`` has one float
    per token; ``finish_reasons[i]`` is ``"stop"`` or ``"length"``.
    """

    tokens: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[str]


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` int64 ``[B, L]`` left-padded with ``pad_id`` and ``valid`` bool ``[B, L]``."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(sequences), width, dtype=torch.bool, device=device)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            valid[row, width - len(seq) :] = True
    return ids, valid


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from float32 ``logits [B, V]``; return ``(tokens [B], logprobs [B])``.

    ``temperature == 0`` is greedy decoding, whose reported logprob is at ``T = 1``.
    """
    scaled = logits / temperature if temperature > 0 else logits
    logprobs = log_softmax(scaled)
    if temperature == 0:
        tokens = logprobs.argmax(dim=-1)
    else:
        probs = logprobs.exp()
        if top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p  # keep the smallest nucleus >= top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if not bool(torch.isfinite(chosen).all()):
        raise RuntimeError(f"sampled a token with non-finite logprob {chosen.tolist()} (a sampler bug)")
    return tokens, chosen


class Decoder(Protocol):
    """One batch's incremental decoding: a prefill, then one token per row and step."""

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ``ids`` int64 ``[B, L]``, ``valid`` bool ``[B, L]`` -> float32 logits ``[B, V]``
        of each row's last position."""

    def step(self, token: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        """Append ``token`` int64 ``[B]`` (a pad where ``running`` bool ``[B]`` is False) -> float32 logits
        ``[B, V]``."""


class CacheDecoder:
    """Decoding over a :class:`KVCache` that grows with each step: attention reads the filled positions only.

    The sampler's reference path, whose logprobs the trainer's teacher-forced scoring reproduces.
    """

    def __init__(self, model: MoETransformer, batch: int, max_len: int):
        device = next(model.parameters()).device
        self.model = model
        self.cache = KVCache(model.config, batch, max_len, dtype=model.plan.torch_compute_dtype, device=device)
        self.next_position: torch.Tensor | None = None

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        logits, self.next_position = prefill(self.model, self.cache, ids, valid)
        return logits

    def step(self, token: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        logits = self.model(
            token.unsqueeze(1),
            positions=self.next_position.unsqueeze(1),
            kv_cache=self.cache,
            attention_mask=running.unsqueeze(1),
        )[:, -1]
        self.next_position = self.next_position + 1
        return logits


def prefill(
    model: MoETransformer, cache: KVCache, ids: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run left-padded prompts ``ids`` int64 ``[B, L]`` (``valid`` bool ``[B, L]``) into ``cache``, emptied first.

    Returns float32 logits ``[B, V]`` of the last position and int64 ``[B]``, each row's next RoPE position.
    """
    cache.reset()
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(ids, positions=positions, kv_cache=cache, attention_mask=valid)[:, -1]
    return logits, valid.long().sum(-1)


@torch.no_grad()
def generate(
    model: MoETransformer,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_tokens: Sequence[int] = (),
    pad_id: int = 0,
    generator: torch.Generator | None = None,
    stop_early: bool = True,
) -> Generation:
    """Sample up to ``max_new_tokens`` tokens after each prompt (token-id lists), all rows in one batch.

    ``stop_early=False`` keeps stepping after every row has stopped (the responses are the same): each
    call then runs exactly ``max_new_tokens`` forwards, which FSDP-sharded models need (every forward
    is a collective, and ranks must agree on their number whatever they decode).

    Raises:
        ValueError: an empty prompt list or prompt, ``temperature < 0``, ``top_p`` outside (0, 1], or a
            prompt plus ``max_new_tokens`` longer than the model's context.
    """
    check_arguments(model, prompts, max_new_tokens, temperature, top_p)
    device = next(model.parameters()).device
    ids, valid = left_pad(prompts, pad_id, device)
    decoder = CacheDecoder(model, len(prompts), ids.shape[1] + max_new_tokens)
    return sample_responses(
        decoder,
        ids,
        valid,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_tokens=stop_tokens,
        pad_id=pad_id,
        generator=generator,
        stop_early=stop_early,
    )


def sample_responses(
    decoder: Decoder,
    ids: torch.Tensor,
    valid: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_tokens: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None,
    stop_early: bool = True,
) -> Generation:
    """The sampling loop of :func:`generate` over any :class:`Decoder`, from left-padded prompts ``ids``
    int64 ``[B, L]`` with ``valid`` bool ``[B, L]``; rows that have stopped feed ``pad_id``."""
    batch = ids.shape[0]
    logits = decoder.prefill(ids, valid)
    stop = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=ids.device)
    running = torch.ones(batch, dtype=torch.bool, device=ids.device)
    tokens, logprobs = [[] for _ in range(batch)], [[] for _ in range(batch)]
    reasons = ["length"] * batch
    for _ in range(max_new_tokens):
        token, logprob = sample_token(logits, temperature, top_p, generator)
        for row in running.nonzero().flatten().tolist():
            tokens[row].append(int(token[row]))
            logprobs[row].append(float(logprob[row]))
        ended = running & torch.isin(token, stop)
        for row in ended.nonzero().flatten().tolist():
            reasons[row] = "stop"
        running = running & ~ended
        if stop_early and not bool(running.any()):
            break
        token = torch.where(running, token, torch.full_like(token, pad_id))
        logits = decoder.step(token, running)
    return Generation(tokens=tokens, logprobs=logprobs, finish_reasons=reasons)


def check_arguments(model, prompts, max_new_tokens, temperature, top_p) -> None:
    """The :func:`generate` argument checks (its ``Raises``)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must lie in (0, 1]")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt of {longest} tokens + max_new_tokens={max_new_tokens} exceeds the context "
            f"(max_position_embeddings={model.config.max_position_embeddings})"
        )
