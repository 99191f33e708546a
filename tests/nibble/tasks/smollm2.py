"""Real SmolLM2-135M-Instruct material for the task tests (see make_smollm2_outputs.py for how it was made)."""

import json
from pathlib import Path

HERE = Path(__file__).parent
SMOLLM2_TOKENIZER = HERE / "smollm2_tokenizer"
SMOLLM2_OUTPUTS = HERE / "smollm2_outputs.json"


def smollm2_records() -> list[dict]:
    """The committed responses, each with its task, problem, reference answer and hand-written label."""
    return json.loads(SMOLLM2_OUTPUTS.read_text())["records"]
