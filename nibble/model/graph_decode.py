"""Decode steps with static shapes, captured once in a CUDA graph and replayed: the sampler's fast decode.

:class:`~nibble.model.generate.CacheDecoder` attends over the ``n`` filled cache positions, so every step
has new shapes and the model's input checks read values back to the host: neither can be captured. Here
the batch ``B`` and cache length ``S`` are fixed, the write position, RoPE positions and key mask live in
device tensors updated in place, and attention reads all ``S`` positions with the unwritten ones masked.

Numerics: a masked key adds an exact zero to the softmax and to ``P @ V``, and attention is row-invariant
(:func:`nibble.recipe.compute.attention`: float64 on the CPU; on CUDA a kernel whose key blocks start at
each sequence's first real key, so that a fully masked block is an exact no-op), so attending over ``S``
keys instead of ``n`` leaves every row's result as it is; the packed NVFP4 GEMM is row-invariant too. The
trainer's teacher-forced scoring therefore reproduces what this decoder samples, bit for bit (on the H200:
``benchmarks/gpu_main_job.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nibble.model.generate import Generation, check_arguments, left_pad, prefill, sample_responses
from nibble.model.kv_cache import KVCache, StaticKVCache
from nibble.model.transformer import MoETransformer
from nibble.recipe.compute import AttentionMask


class GraphDecoder:
    """A :class:`~nibble.model.generate.Decoder`: prefill on the dynamic path, then one-token steps over
    static buffers.

    On CUDA the step is captured at construction in a ``torch.cuda.CUDAGraph`` (after eager warm-up steps,
    which also run Triton's autotuning) and each :meth:`step` replays it; with ``graph=False``, and always
    on the CPU, the same step runs eagerly. The graph keeps the addresses of the model's tensors at
    construction: weights updated in place (``copy_``, as ``load_sampler_state`` does) are seen by later
    replays; tensors replaced (``pack()``, a new ``.data`` or ``packed``) are not — build a new decoder.

    Args:
        model: the policy, in training or packed (sampler) form.
        batch: rows ``B`` of every prefill and step.
        max_len: cache positions ``S``: the longest prompt plus the steps taken.
        graph: capture the step in a CUDA graph; default: on CUDA.
    Raises:
        ValueError: ``batch < 1``, ``max_len < 1``, ``max_len`` beyond the model's context, or ``graph=True``
            off CUDA.
    """

    def __init__(self, model: MoETransformer, batch: int, max_len: int, *, graph: bool | None = None):
        if batch < 1 or not 1 <= max_len <= model.config.max_position_embeddings:
            raise ValueError(
                f"GraphDecoder needs batch >= 1 and 1 <= max_len <= max_position_embeddings="
                f"{model.config.max_position_embeddings}, got batch={batch}, max_len={max_len}"
            )
        device = next(model.parameters()).device
        graph = device.type == "cuda" if graph is None else graph
        if graph and device.type != "cuda":
            raise ValueError(f"graph=True needs a model on CUDA, this one is on {device}")
        self.model, self.batch, self.max_len = model, batch, max_len
        self.cache = KVCache(model.config, batch, max_len, dtype=model.plan.torch_compute_dtype, device=device)
        self.static = StaticKVCache(self.cache)
        # The step's inputs and output: fixed addresses that the graph reads and writes.
        self.token = torch.zeros(batch, dtype=torch.long, device=device)
        self.running = torch.ones(batch, dtype=torch.bool, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.logits = torch.zeros(batch, model.config.vocab_size, dtype=torch.float32, device=device)
        self.length = 0  # the host's copy of static.index: filled positions, kept without reading the device
        self.graph = self._capture() if graph else None

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts ``ids`` int64 ``[B, L]``, ``valid`` bool ``[B, L]`` -> float32 logits ``[B, V]``
        of the last position; resets the cache (the buffers are reused from call to call).

        Raises:
            ValueError: a batch other than ``B``, or ``L > max_len``.
        """
        if ids.shape[0] != self.batch or ids.shape[1] > self.max_len:
            raise ValueError(
                f"prefill of {tuple(ids.shape)} tokens: this decoder takes [{self.batch}, <= {self.max_len}]"
            )
        logits, next_position = prefill(self.model, self.cache, ids, valid)
        self.positions.copy_(next_position)
        self.static.index.fill_(ids.shape[1])
        self.length = ids.shape[1]
        return logits

    def step(self, token: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
        """Append ``token`` int64 ``[B]`` (pads where ``running`` bool ``[B]`` is False; ids are not checked,
        which would read them back to the host) -> float32 logits ``[B, V]``, a buffer the next step overwrites.

        Raises:
            ValueError: ``token`` or ``running`` not of shape ``[B]``, no :meth:`prefill` yet, or all
                ``max_len`` positions filled.
        """
        if tuple(token.shape) != (self.batch,) or tuple(running.shape) != (self.batch,):
            raise ValueError(
                f"step takes token and running of shape [{self.batch}], got {tuple(token.shape)} and "
                f"{tuple(running.shape)}"
            )
        if self.length == 0:
            raise ValueError("step before prefill: the cache holds no prompt (call prefill first)")
        if self.length >= self.max_len:
            raise ValueError(
                f"the cache's {self.max_len} positions are filled; build the decoder with a larger max_len"
            )
        self.token.copy_(token)
        self.running.copy_(running)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()
        self.length += 1
        return self.logits

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_tokens: Sequence[int] = (),
        pad_id: int = 0,
        generator: torch.Generator | None = None,
    ) -> Generation:
        """:func:`~nibble.model.generate.generate` through this decoder.

        Raises:
            ValueError: as ``generate``, and ``len(prompts) != B`` or the longest prompt plus
                ``max_new_tokens`` beyond ``max_len``.
        """
        check_arguments(self.model, prompts, max_new_tokens, temperature, top_p)
        if len(prompts) != self.batch:
            raise ValueError(f"{len(prompts)} prompts for a decoder of batch {self.batch}")
        ids, valid = left_pad(prompts, pad_id, self.token.device)
        if ids.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt of {ids.shape[1]} tokens + max_new_tokens={max_new_tokens} exceeds the decoder's "
                f"max_len={self.max_len}"
            )
        return sample_responses(
            self,
            ids,
            valid,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_tokens=stop_tokens,
            pad_id=pad_id,
            generator=generator,
        )

    @torch.no_grad()
    def _step(self) -> None:
        """The captured step: reads ``token``, ``running``, ``positions`` and the write index; writes the
        cache and ``logits``; advances ``positions`` and the index. Masks as ``MoETransformer._attention_mask``
        does for one new token: real keys up to the write index (later slots are not written yet), and a
        padding query sees only its own key."""
        self.static.reserve(self.running)
        mask = AttentionMask(
            key_mask=self.cache.key_mask, query_valid=self.running.unsqueeze(1), query_offset=self.static.index
        )
        logits = self.model.forward_masked(self.token.unsqueeze(1), self.positions.unsqueeze(1), mask, self.static)
        self.logits.copy_(logits[:, -1])
        self.positions += 1
        self.static.advance()

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Warm up on a side stream (autotuning and library handles must not happen during capture), then
        capture one step. The warm-up steps' writes are discarded by the next :meth:`prefill`."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.static.index.zero_()  # in bounds whatever max_len
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step()
        return graph
