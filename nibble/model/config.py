"""Model configuration: the Qwen3-MoE / Qwen2-MoE hyper-parameters Nibble's transformer understands."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Architecture = Literal["qwen3_moe", "qwen2_moe"]

# transformers' Qwen3MoeConfig / Qwen2MoeConfig defaults for keys that a config.json may leave out.
HF_DEFAULTS = {
    "norm_topk_prob": False,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
}


def _int_tuple(field: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{field} must be a list of layer indices, got {value!r}")
    return tuple(value)


class ModelConfig(BaseModel):
    """Hyper-parameters of a decoder-only MoE transformer, named as in Hugging Face's configs.

    ``qwen3_moe``: per-head q/k RMSNorm, no attention bias, optional shared expert (Nibble's
    extension, as in Qwen2-MoE). ``qwen2_moe``: q/k/v bias, no q/k norm, a sigmoid-gated shared expert.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: Architecture = "qwen3_moe"
    vocab_size: int = Field(ge=2)
    hidden_size: int = Field(ge=16)
    intermediate_size: int = Field(ge=16, description="dense MLP width (layers in mlp_only_layers)")
    moe_intermediate_size: int = Field(ge=16, description="routed expert width")
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    num_experts: int = Field(ge=1)
    num_experts_per_tok: int = Field(ge=1)
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = Field(1, ge=1)
    shared_expert_intermediate_size: int = Field(0, ge=0, description="0: no shared expert")
    rms_norm_eps: float = Field(1e-6, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    max_position_embeddings: int = Field(2048, ge=1)
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} > num_experts={self.num_experts}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (rotary embedding)")
        for layer in self.mlp_only_layers:
            if not 0 <= layer < self.num_hidden_layers:
                raise ValueError(f"mlp_only_layers holds {layer}, outside [0, {self.num_hidden_layers})")
        return self

    @property
    def qk_norm(self) -> bool:
        return self.architecture == "qwen3_moe"

    @property
    def qkv_bias(self) -> bool:
        return self.architecture == "qwen2_moe"

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` has routed experts (else a dense MLP), as HF decides it."""
        return index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from an HF ``config.json`` dict (both ``num_experts`` and ``num_local_experts`` spellings).

        Raises:
            ValueError: an unsupported ``model_type`` or a missing required key (named).
        """
        if not isinstance(hf, dict):
            raise ValueError(f"the top level must be an object, got {type(hf).__name__}")
        model_type = hf.get("model_type")
        if model_type not in ("qwen3_moe", "qwen2_moe"):
            raise ValueError(f"model_type={model_type!r}; supported: 'qwen3_moe', 'qwen2_moe'")
        hf = {**HF_DEFAULTS, **hf}  # transformers' defaults for keys a config.json may omit
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        rope = hf.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ValueError(f"rope_parameters must be an object, got {rope!r}")
        values = {
            "architecture": model_type,
            "num_experts": experts,
            "rope_theta": rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            "head_dim": hf.get("head_dim") or (hf.get("hidden_size", 0) // max(hf.get("num_attention_heads", 1), 1)),
            "shared_expert_intermediate_size": hf.get("shared_expert_intermediate_size", 0) or 0,
            "mlp_only_layers": _int_tuple("mlp_only_layers", hf.get("mlp_only_layers") or ()),
        }
        for key in cls.model_fields:
            if key not in values and key in hf:
                values[key] = hf[key]
        missing = [k for k, f in cls.model_fields.items() if f.is_required() and values.get(k) is None]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return cls(**values)

    def to_hf(self) -> dict[str, Any]:
        """An HF ``config.json`` dict that transformers' Qwen3-MoE / Qwen2-MoE classes load."""
        out = self.model_dump(exclude={"architecture", "rope_theta"})
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        out.update(
            model_type=self.architecture,
            architectures=["Qwen3MoeForCausalLM" if self.architecture == "qwen3_moe" else "Qwen2MoeForCausalLM"],
            hidden_act="silu",
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            rope_theta=self.rope_theta,
            attention_bias=False,
            qkv_bias=self.qkv_bias,
            use_sliding_window=False,
        )
        if not self.shared_expert_intermediate_size:
            out.pop("shared_expert_intermediate_size")
        return out


def tiny(vocab_size: int) -> ModelConfig:
    """The default CPU model (~2 M parameters): 4 layers, 8 experts top-2, one shared expert."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        shared_expert_intermediate_size=128,
        max_position_embeddings=256,
    )


def qwen3_30b_a3b_shaped(vocab_size: int = 151936, num_layers: int = 4) -> ModelConfig:
    """Qwen3-30B-A3B's layer dimensions (hidden 2048, 128 experts top-8, expert 768) with fewer layers."""
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=num_layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
    )
