"""NVFP4 checkpoint interop: Nibble's quantised weights in the compressed-tensors and ModelOpt layouts
that vLLM, SGLang and TensorRT-LLM load (``nibble export-checkpoint`` / ``import-checkpoint``)."""

from nibble.interop.checkpoint import (
    LAYOUTS,
    QuantizedCheckpoint,
    dequantized_state,
    export_checkpoint,
    from_model_dir,
    import_checkpoint,
    version_dir,
    write_dequantized,
)
from nibble.interop.layout import (
    ModuleWeight,
    decode_scale,
    encode_scale,
    fuse_state,
    fused_scale_conflicts,
    split_state,
)

__all__ = [
    "LAYOUTS",
    "ModuleWeight",
    "QuantizedCheckpoint",
    "decode_scale",
    "dequantized_state",
    "encode_scale",
    "export_checkpoint",
    "from_model_dir",
    "fuse_state",
    "fused_scale_conflicts",
    "import_checkpoint",
    "split_state",
    "version_dir",
    "write_dequantized",
]
