"""Real SmolLM2-135M-Instruct material for the task tests (make_smollm2_outputs.py says how it was made)."""

import gzip
import shutil
from pathlib import Path

HERE = Path(__file__).parent
SMOLLM2_FILES = HERE / "smollm2_tokenizer"  # tokenizer_config.json (with the chat template), tokenizer.json.gz


def unpack_smollm2_tokenizer(folder: Path) -> Path:
    """Write SmolLM2's tokenizer directory (tokenizer.json, tokenizer_config.json) into ``folder``; return it."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(SMOLLM2_FILES / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "tokenizer.json").write_bytes(gzip.decompress((SMOLLM2_FILES / "tokenizer.json.gz").read_bytes()))
    return folder
