"""Generation engines: the interface every engine implements, and the built-in PyTorch one.

An engine only swaps weights between :meth:`Engine.generate` calls (``pause`` → ``update_weights`` →
``resume``), so all tokens of a batch come from one ``policy_version`` (docs/design.md §5). An external
engine (SGLang, :mod:`nibble.sampler.sglang`) is driven through the same four methods.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nibble.model import MoETransformer
from nibble.model.generate import generate
from nibble.model.graph_decode import GraphDecoder
from nibble.recipe.export import load_sampler_state


@dataclass(frozen=True)
class Sample:
    """One response: token ids (the stop token included when one ended it), the sampler logprob μ of
    each token, and why it ended (``"stop"`` | ``"length"``)."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


class EngineUnavailable(RuntimeError):
    """An external engine's server could not be reached (or did not answer in time): nothing is known to have
    changed on it, and the call may be tried again later."""


class Engine(ABC):
    """What the sampler service needs from a generation engine."""

    policy_version: int
    loads_from_disk: bool = False
    """True for an engine that reads each version from weight-sync's export directory itself: the sampler then
    fetches no tensors and passes ``state=None`` to :meth:`update_weights`."""

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        stop_tokens: Sequence[int],
        seed: int,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt, all with the weights of :attr:`policy_version`.

        Raises:
            RuntimeError: when called while paused.
        """

    @abstractmethod
    def pause(self) -> None:
        """Finish the batch in flight, then refuse new ones until :meth:`resume`."""

    @abstractmethod
    def update_weights(self, version: int, state: dict[str, torch.Tensor] | None) -> None:
        """Install weight-sync's form of ``version`` (only while paused; atomically: all or nothing); ``state``
        is ``None`` for an engine that :attr:`loads_from_disk`.

        Raises:
            RuntimeError: when not paused. ValueError: state that does not fit the model (nothing applied).
        """

    @abstractmethod
    def resume(self) -> None:
        """Accept :meth:`generate` calls again."""


class BuiltinEngine(Engine):
    """Nibble's own engine: the packed (sampler-form) :class:`MoETransformer` and batched sampling.

    On CUDA, batches of up to ``batch_rows`` responses decode through a
    :class:`~nibble.model.graph_decode.GraphDecoder` (one CUDA-graph replay per token over a static KV cache,
    the packed NVFP4 kernels inside), built on the first batch and rebuilt only when a longer prompt needs a
    longer cache; a smaller batch is padded with copies of its first prompt, whose samples are dropped.
    On the CPU, or without ``batch_rows``, every batch runs :func:`~nibble.model.generate.generate`.

    Args:
        model: the sampler form (``pack()``) of the policy, on its device.
        pad_id: the tokenizer's padding id.
        policy_version: the version the weights are.
        batch_rows: responses per batch (``groups_per_batch × group_size``) for the CUDA-graph decoder.
    """

    def __init__(self, model: MoETransformer, *, pad_id: int, policy_version: int = 0, batch_rows: int | None = None):
        self.model = model.eval()
        self.pad_id = pad_id
        self.policy_version = policy_version
        self.device = next(model.parameters()).device
        self.batch_rows = batch_rows if self.device.type == "cuda" else None
        self._decoder: GraphDecoder | None = None
        self._lock = threading.Lock()
        self._paused = False

    def generate(self, prompts, *, n, max_new_tokens, temperature, top_p, stop_tokens, seed):
        with self._lock:
            if self._paused:
                raise RuntimeError("engine is paused (weights are being updated)")
            repeated = [list(p) for p in prompts for _ in range(n)]
            options = dict(
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                stop_tokens=stop_tokens,
                pad_id=self.pad_id,
                generator=torch.Generator(self.device).manual_seed(seed),
            )
            if self.batch_rows is not None and len(repeated) <= self.batch_rows:
                filled = repeated + [repeated[0]] * (self.batch_rows - len(repeated))
                out = self._graph_decoder(filled, max_new_tokens).generate(filled, **options)
            else:
                out = generate(self.model, repeated, **options)
        rows = zip(out.tokens, out.logprobs, out.finish_reasons, strict=True)
        samples = [Sample(t, lp, r) for t, lp, r in list(rows)[: len(repeated)]]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _graph_decoder(self, prompts: list[list[int]], max_new_tokens: int) -> GraphDecoder:
        """The captured decoder, rebuilt (cache rounded up to 64 positions) when this batch needs more."""
        needed = max(len(p) for p in prompts) + max_new_tokens
        if self._decoder is None or self._decoder.max_len < needed:
            self._decoder = None  # free the old graph's buffers before capturing the new one
            limit = self.model.config.max_position_embeddings
            self._decoder = GraphDecoder(self.model, self.batch_rows, min(limit, -(-needed // 64) * 64))
        return self._decoder

    def pause(self) -> None:
        with self._lock:  # waits for the batch in flight
            self._paused = True

    def update_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        with self._lock:
            if not self._paused:
                raise RuntimeError("update_weights needs a paused engine")
            load_sampler_state(self.model, state)  # validates everything before copying anything
            self.policy_version = version

    def resume(self) -> None:
        with self._lock:
            self._paused = False
