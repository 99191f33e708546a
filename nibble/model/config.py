"""Model configuration: the hyper-parameters of the architectures Nibble's transformer understands —
Qwen3-MoE and Qwen2-MoE, and the dense Llama, Qwen2 and Qwen3."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nibble.model.rope import YarnScaling

Architecture = Literal["qwen3_moe", "qwen2_moe", "llama", "qwen2", "qwen3"]

MOE_ARCHITECTURES = ("qwen3_moe", "qwen2_moe")

HF_CLASSES = {
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
"""The transformers class (``architectures`` entry of config.json) of each supported ``model_type``."""

# transformers' config-class defaults for keys that a config.json may leave out.
HF_DEFAULTS = {
    "norm_topk_prob": False,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
    "attention_bias": False,
}

# Keys of an HF config.json that change nothing Nibble computes (bookkeeping, initialisation, generation
# defaults, HF's own training switches). Every other key is implemented below or refused by name.
INERT_KEYS = frozenset({
    "architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
    "_name_or_path", "_model_name_or_path",  # where a loader read it from
    "initializer_range", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
    "output_router_logits", "router_aux_loss_coef",  # transformers' auxiliary loss; Nibble's RL loss has none
    "qkv_bias",  # written by to_hf: implied by the architecture
    "output_attentions", "output_hidden_states", "return_dict",  # what transformers' forward returns
    "id2label", "label2id", "problem_type",  # classification heads, which a causal LM does not have
    "chunk_size_feed_forward",  # transformers' memory-saving chunking: the same result
    "attn_implementation",  # which transformers attention kernel computes it: the same function
    "is_llama_config", "transformers.js_config",  # written by SmolLM2's training and web-export tools
})  # fmt: skip
# Keys Nibble does not implement but accepts at the one value that means "off" (anything else is refused).
OFF_VALUES = {
    "hidden_act": ("silu",),
    "attention_dropout": (0, 0.0),
    "use_sliding_window": (False,),
    "mlp_bias": (False,),
    "pretraining_tp": (1,),  # Llama's tensor-parallel pretraining split: 1 computes the plain product
    "rope_interleaved": (False,),  # SmolLM2's nanotron key: rotate halves, as transformers' Llama does
    "is_encoder_decoder": (False,),
}
# Accepted only alongside use_sliding_window: false, where they have no effect.
SLIDING_WINDOW_KEYS = ("sliding_window", "max_window_layers", "layer_types")


def _int_tuple(field: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{field} must be a list of layer indices, got {value!r}")
    return tuple(value)


class ModelConfig(BaseModel):
    """Hyper-parameters of a decoder-only transformer, named as in Hugging Face's configs.

    ``qwen3_moe``: per-head q/k RMSNorm, optional shared expert (Nibble's extension, as in Qwen2-MoE).
    ``qwen2_moe``: q/k/v bias, no q/k norm, a sigmoid-gated shared expert. The dense architectures
    have a SwiGLU MLP in every layer and no expert fields (``num_experts`` 0): ``llama`` (no q/k norm),
    ``qwen2`` (q/k/v bias) and ``qwen3`` (q/k norm). ``attention_bias`` adds q/k/v/o biases to
    ``llama``, ``qwen3`` and ``qwen3_moe`` as transformers does.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    architecture: Architecture = "qwen3_moe"
    vocab_size: int = Field(ge=2)
    hidden_size: int = Field(ge=16)
    intermediate_size: int = Field(ge=16, description="dense MLP width (layers in mlp_only_layers)")
    moe_intermediate_size: int = Field(0, ge=0, description="routed expert width (0 for dense models)")
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    num_experts: int = Field(0, ge=0, description="routed experts per MoE layer (0 for dense models)")
    num_experts_per_tok: int = Field(0, ge=0)
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = Field(1, ge=1)
    shared_expert_intermediate_size: int = Field(0, ge=0, description="0: no shared expert")
    rms_norm_eps: float = Field(1e-6, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    max_position_embeddings: int = Field(2048, ge=1)
    tie_word_embeddings: bool = False
    rope_scaling: YarnScaling | None = Field(None, description="YaRN context extension; None: plain RoPE")
    attention_bias: bool = False

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.is_moe:
            if self.num_experts < 1 or self.num_experts_per_tok < 1 or self.moe_intermediate_size < 16:
                raise ValueError(
                    f"{self.architecture} needs num_experts >= 1, num_experts_per_tok >= 1 and "
                    f"moe_intermediate_size >= 16, got {self.num_experts}, {self.num_experts_per_tok}, "
                    f"{self.moe_intermediate_size}"
                )
        elif self.num_experts or self.num_experts_per_tok or self.shared_expert_intermediate_size:
            raise ValueError(
                f"{self.architecture} is dense: num_experts, num_experts_per_tok and "
                "shared_expert_intermediate_size must be 0"
            )
        if self.attention_bias and self.architecture in ("qwen2", "qwen2_moe"):
            raise ValueError(f"attention_bias does not apply to {self.architecture} (its q/k/v always carry a bias)")
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
    def is_moe(self) -> bool:
        return self.architecture in MOE_ARCHITECTURES

    @property
    def qk_norm(self) -> bool:
        return self.architecture in ("qwen3_moe", "qwen3")

    @property
    def qkv_bias(self) -> bool:
        return self.architecture in ("qwen2_moe", "qwen2") or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` has routed experts (else a dense MLP), as HF decides it."""
        return self.is_moe and index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """Build from an HF ``config.json`` dict (both ``num_experts`` and ``num_local_experts`` spellings,
        ``rope_parameters`` or the older ``rope_theta`` + ``rope_scaling``).

        Every key is implemented, known to change nothing (``INERT_KEYS``), or refused: nothing is dropped.

        Raises:
            ValueError: an unsupported ``model_type``, a missing required key, or a key (or value) Nibble does
                not implement — each named.
        """
        if not isinstance(hf, dict):
            raise ValueError(f"the top level must be an object, got {type(hf).__name__}")
        model_type = hf.get("model_type")
        if model_type not in HF_CLASSES:
            raise ValueError(f"model_type={model_type!r}; supported: {', '.join(map(repr, HF_CLASSES))}")
        _refuse_unimplemented(hf, model_type)
        hf = {**HF_DEFAULTS, **hf}  # transformers' defaults for keys a config.json may omit
        experts = hf.get("num_experts", hf.get("num_local_experts")) if model_type in MOE_ARCHITECTURES else 0
        theta, yarn = _rope(hf)
        values = {
            "architecture": model_type,
            "num_experts": experts,
            "rope_theta": theta,
            "rope_scaling": yarn,
            "head_dim": hf.get("head_dim") or (hf.get("hidden_size", 0) // max(hf.get("num_attention_heads", 1), 1)),
            "shared_expert_intermediate_size": (hf.get("shared_expert_intermediate_size", 0) or 0)
            if model_type in MOE_ARCHITECTURES
            else 0,
            "num_experts_per_tok": hf.get("num_experts_per_tok") if model_type in MOE_ARCHITECTURES else 0,
            "moe_intermediate_size": hf.get("moe_intermediate_size") if model_type in MOE_ARCHITECTURES else 0,
            "attention_bias": False if model_type in ("qwen2", "qwen2_moe") else hf["attention_bias"],
            # transformers' default for configs written before grouped-query attention (Llama 2 era)
            "num_key_value_heads": hf.get("num_key_value_heads") or hf.get("num_attention_heads"),
            "mlp_only_layers": _int_tuple("mlp_only_layers", hf.get("mlp_only_layers") or ()),
        }
        for key in cls.model_fields:
            if key not in values and key in hf:
                values[key] = hf[key]
        required = [k for k, f in cls.model_fields.items() if f.is_required()]
        if model_type in MOE_ARCHITECTURES:
            required += ["num_experts", "num_experts_per_tok", "moe_intermediate_size"]
        missing = [k for k in required if values.get(k) is None]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        # strict: a config.json saying "576" or "false" is refused, as transformers refuses it, not coerced
        return cls.model_validate(values, strict=True)

    def to_hf(self) -> dict[str, Any]:
        """An HF ``config.json`` dict that transformers' class for the architecture loads."""
        out = self.model_dump(exclude={"architecture", "rope_theta", "rope_scaling"})
        out["mlp_only_layers"] = list(self.mlp_only_layers)
        out.update(
            model_type=self.architecture,
            architectures=[HF_CLASSES[self.architecture]],
            hidden_act="silu",
            rope_parameters={
                **(self.rope_scaling.to_hf() if self.rope_scaling else {"rope_type": "default"}),
                "rope_theta": self.rope_theta,
            },
            rope_theta=self.rope_theta,
            use_sliding_window=False,
        )
        if self.is_moe:
            out["qkv_bias"] = self.qkv_bias
        else:
            for key in (
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "norm_topk_prob",
                "mlp_only_layers",
                "decoder_sparse_step",
                "shared_expert_intermediate_size",
            ):
                out.pop(key)
            out["mlp_bias"] = False
        if not self.shared_expert_intermediate_size:
            out.pop("shared_expert_intermediate_size", None)
        return out


def _refuse_unimplemented(hf: dict[str, Any], model_type: str) -> None:
    """Raise naming the first key of ``hf`` that Nibble neither implements nor knows to be inert."""
    implemented = set(ModelConfig.model_fields) - {"architecture", "rope_scaling"}
    implemented |= {"num_local_experts", "rope_parameters", "rope_scaling", "rope_theta"}
    if model_type in ("qwen2", "qwen2_moe"):
        # Qwen2's q/k/v carry a bias by construction (Nibble's qwen2 models have it): the flag must not deny it
        off = {**OFF_VALUES, "qkv_bias": (True,)}
    else:
        off = OFF_VALUES
    for key, value in hf.items():
        if key in implemented or (key in INERT_KEYS and key not in off):
            continue
        if key in off:
            if value not in off[key]:
                allowed = " or ".join(repr(v) for v in dict.fromkeys(off[key]))
                raise ValueError(f"{key}={value!r} is not supported (Nibble implements {key}={allowed})")
            continue
        if key in SLIDING_WINDOW_KEYS:
            if hf.get("use_sliding_window") and key != "layer_types":
                continue  # refused through use_sliding_window itself
            if key == "layer_types" and any(t != "full_attention" for t in value or ()):
                raise ValueError(f"layer_types={value!r} is not supported (Nibble implements full attention only)")
            continue
        raise ValueError(f"config key {key!r} is not supported by Nibble's loader (value {value!r})")


def _rope(hf: dict[str, Any]) -> tuple[float, YarnScaling | None]:
    """``(rope_theta, YaRN parameters or None)`` from ``rope_parameters`` (transformers ≥ 5) or
    ``rope_theta`` + ``rope_scaling`` (older); any other RoPE type or key is refused by name."""
    for key in ("rope_parameters", "rope_scaling"):
        if hf.get(key) is not None and not isinstance(hf[key], dict):
            raise ValueError(f"{key} must be an object, got {hf[key]!r}")
    scaling, params = hf.get("rope_scaling") or {}, hf.get("rope_parameters")
    key = "rope_parameters" if params is not None else "rope_scaling"
    if params is not None and scaling:
        kinds = {_rope_type(scaling), _rope_type(params)}
        if len(kinds) > 1:
            raise ValueError(f"rope_scaling and rope_parameters disagree on the RoPE type ({sorted(kinds)})")
    params = {**scaling, **(params or {})}
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if hf.get("rope_theta") is not None and hf["rope_theta"] != theta:
        raise ValueError(f"rope_theta={hf['rope_theta']!r} disagrees with {key}.rope_theta={theta!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"{key}.partial_rotary_factor={params['partial_rotary_factor']!r} is not supported (1.0)")
    params.pop("partial_rotary_factor", None)
    if rope_type == "default":
        if params:
            raise ValueError(f"{key} key {sorted(params)[0]!r} is not supported with rope_type 'default'")
        return theta, None
    if rope_type != "yarn":
        raise ValueError(f"{key}.rope_type={rope_type!r} is not supported (Nibble implements 'default' and 'yarn')")
    try:
        return theta, YarnScaling(**params)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ValueError(f"{key}.{where}: {error['msg']}") from None


def _rope_type(params: dict[str, Any]) -> str:
    return params.get("rope_type", params.get("type", "default"))


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
