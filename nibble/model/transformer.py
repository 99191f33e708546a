"""The decoder-only transformer (``Qwen3MoeForCausalLM`` / ``LlamaForCausalLM`` … compatible names and math)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nibble.model.config import ModelConfig
from nibble.model.kv_cache import KVCache, StaticKVCache
from nibble.model.layers import MLP, DecoderLayer, RMSNorm
from nibble.model.rope import frequencies, rotary
from nibble.recipe.compute import AttentionMask
from nibble.recipe.modules import PlannedExperts, PlannedLinear, bf16_operand
from nibble.recipe.plan import PrecisionPlan


class _Backbone(nn.Module):
    def __init__(self, config: ModelConfig, plan: PrecisionPlan):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)
        self.layers = nn.ModuleList(DecoderLayer(config, plan, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, plan)


def _check_logits_from(logits_from: int, length: int) -> None:
    """A negative ``logits_from`` would slice from the end and one past ``T`` give no rows: both silently."""
    if isinstance(logits_from, bool) or not isinstance(logits_from, int) or not 0 <= logits_from <= length:
        raise ValueError(f"logits_from={logits_from!r}: expected an int in [0, {length}] (the sequence length)")


class MoETransformer(nn.Module):
    """A causal LM: ``forward(input_ids [B, T]) -> logits [B, T, V]`` (float32).

    MoE (Qwen3-MoE, Qwen2-MoE) or dense (Llama, Qwen2, Qwen3) as ``config.architecture`` says; dense
    models are MoE models whose every layer is an MLP layer. Parameters are named as Hugging Face's
    (``model.layers.{i}.mlp.experts.gate_up_proj``, ``model.layers.{i}.mlp.gate_proj.weight`` …);
    :mod:`nibble.model.hf` converts to and from checkpoints. Every weight enters the forward through its
    bf16 cast and the format the ``plan`` gives it. With ``tie_word_embeddings`` the LM head *is* the
    embedding parameter (one tensor, named ``model.embed_tokens.weight`` in ``named_parameters``, in the
    trainer's and in the sampler's form alike), so it is trained, published and applied once.
    """

    def __init__(self, config: ModelConfig, plan: PrecisionPlan | None = None):
        super().__init__()
        plan = plan or PrecisionPlan(num_layers=config.num_hidden_layers, format="bf16")
        if plan.num_layers != config.num_hidden_layers:
            raise ValueError(f"plan is for {plan.num_layers} layers, model has {config.num_hidden_layers}")
        self.config, self.plan = config, plan
        self.model = _Backbone(config, plan)
        self.lm_head = PlannedLinear(config.hidden_size, config.vocab_size, bias=False, fmt="bf16", plan=plan)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        logits_from: int = 0,
    ) -> torch.Tensor:
        """Logits for every position from ``logits_from`` on.

        Args:
            input_ids: int64 ``[B, T]``.
            positions: int64 ``[B, T]`` RoPE positions; default ``arange`` continuing the cache.
            kv_cache: append this chunk's keys/values and attend to everything cached before it.
            attention_mask: bool ``[B, T]``, False for padding tokens (they are never attended to).
            logits_from: first position whose logits are wanted (the LM head, row-invariant, skips the
                others: a scorer needs only the response's).
        Returns:
            float32 ``[B, T - logits_from, vocab_size]``.
        Raises:
            ValueError: a position at or beyond ``max_position_embeddings``, a token id outside the vocab,
                or ``logits_from`` not an int in ``[0, T]``.
        """
        b, t = input_ids.shape
        _check_logits_from(logits_from, t)
        start = kv_cache.length if kv_cache is not None else 0
        if positions is None:
            positions = torch.arange(start, start + t, device=input_ids.device).expand(b, t)
        self._check_inputs(input_ids, positions)
        valid = attention_mask if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        mask = self._attention_mask(valid, kv_cache)
        logits = self.forward_masked(input_ids, positions, mask, kv_cache, logits_from)
        if kv_cache is not None:
            kv_cache.advance(t)
        return logits

    def forward_masked(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: AttentionMask,
        kv_cache: KVCache | StaticKVCache | None = None,
        logits_from: int = 0,
    ) -> torch.Tensor:
        """:meth:`forward` from a ready attention mask, without its input checks (they read values back to
        the host): the decode step that :class:`~nibble.model.graph_decode.GraphDecoder` captures.

        Args:
            input_ids: int64 ``[B, T]``, assumed inside the vocab.
            positions: int64 ``[B, T]`` RoPE positions, assumed below ``max_position_embeddings``.
            mask: which keys each query attends to, over the ``S`` keys the cache's ``update`` returns
                (``T`` without a cache).
            kv_cache: written at this chunk's positions; not advanced.
            logits_from: as in :meth:`forward`.
        Returns:
            float32 ``[B, T - logits_from, vocab_size]``.
        Raises:
            ValueError: ``logits_from`` not an int in ``[0, T]`` (a host-side check: nothing read back).
        """
        _check_logits_from(logits_from, input_ids.shape[1])
        cd = self.plan.torch_compute_dtype
        x = F.embedding(input_ids, bf16_operand(self.model.embed_tokens.weight, self.plan)).to(cd)
        c = self.config
        inv_freq, scale = frequencies(
            c.head_dim, c.rope_theta, c.max_position_embeddings, c.rope_scaling, positions.device
        )
        cos, sin = (t.to(cd) for t in rotary(positions, inv_freq, scale))  # cast once, not in every layer
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, kv_cache)
        return self.lm_head(self.model.norm(x[:, logits_from:])).to(torch.float32)

    def _check_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        if positions.numel() and int(positions.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(positions.max())} >= max_position_embeddings={self.config.max_position_embeddings}"
                " (prompt plus response longer than the context)"
            )
        if input_ids.numel() and not (int(input_ids.min()) >= 0 and int(input_ids.max()) < self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got {input_ids.min()}..{input_ids.max()}"
            )

    @staticmethod
    def _attention_mask(valid: torch.Tensor, cache: KVCache | None) -> AttentionMask:
        """Causal over all cached + new keys, pads never attended to (a padding query sees itself)."""
        offset = 0 if cache is None else cache.length
        if cache is None:
            keys = valid
        else:
            cache.reserve(valid)
            keys = cache.key_mask[:, : cache.length + valid.shape[1]]
        query_offset = torch.full((1,), offset, dtype=torch.long, device=valid.device)
        return AttentionMask(key_mask=keys, query_valid=valid, query_offset=query_offset)

    def pack(self) -> MoETransformer:
        """Convert to the sampler's form in place (packed quantised weights, bf16 elsewhere, no grads)."""
        mlps = [m for m in self.modules() if isinstance(m, MLP)]
        for mlp in mlps:  # an MLP packs its own projections: gate and up may share one global scale
            mlp.pack()
        in_mlps = {id(proj) for mlp in mlps for proj in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)}
        for module in self.modules():
            if isinstance(module, (PlannedLinear, PlannedExperts)) and id(module) not in in_mlps:
                module.pack()
        for param in self.parameters():  # embeddings, norms, router: their bf16 cast is what computes
            param.requires_grad_(False)
            param.data = param.data.to(torch.bfloat16)
        if self.config.tie_word_embeddings:  # packing gave lm_head a parameter of its own: tie it again
            self.lm_head.weight = self.model.embed_tokens.weight
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, path, *, dtype: torch.dtype = torch.float32) -> None:
        """Write an HF-format directory (config.json + model.safetensors, per-expert layout)."""
        from nibble.model.hf import save_pretrained

        save_pretrained(self, path, dtype=dtype)
