"""The policy model: a transformer compatible with HF Qwen-MoE, Llama, Qwen2 and Qwen3, its KV cache,
generation, HF adapter and importer."""

from nibble.model.config import ModelConfig, qwen3_30b_a3b_shaped, tiny
from nibble.model.hf import from_pretrained, load_config, save_pretrained
from nibble.model.kv_cache import KVCache
from nibble.model.transformer import MoETransformer

__all__ = [
    "KVCache",
    "MoETransformer",
    "ModelConfig",
    "from_pretrained",
    "load_config",
    "qwen3_30b_a3b_shaped",
    "save_pretrained",
    "tiny",
]
