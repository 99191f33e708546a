"""An imported pretrained model (``nibble import-model``) in Nibble: logit parity with transformers, greedy
chat replies, and CPU decode speed, for the BF16 plan and the NVFP4 ``all_linear`` plan.

Parity: Nibble's forward against transformers' ``AutoModelForCausalLM`` on the same checkpoint directory
(float32 compute; Nibble reads each weight through its bf16 cast, and the checkpoint stores bf16), and
optionally against transformers' load of the source GGUF itself (its float32 dequantised weights, so
the difference includes the bf16 rounding of the weights). Records everything, with the machine, in
benchmarks/results/imported_model_cpu.json.

    .venv/bin/nibble import-model SmolLM2-135M-Instruct.Q4_1.gguf --out runs/smollm2-135m-instruct
    .venv/bin/python -m benchmarks.imported_model --checkpoint runs/smollm2-135m-instruct \
        --gguf SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.machine import describe, write_record
from nibble.model import from_pretrained, load_config
from nibble.model.generate import generate
from nibble.recipe import PrecisionPlan

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "What is 12 + 7?",
    "Name three colours of the rainbow.",
]


def chat_prompts(tokenizer) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        for q in QUESTIONS
    ]


def as_ids(encoded) -> list[int]:
    """``apply_chat_template(tokenize=True)`` gives a list, or a mapping with ``input_ids``, by version."""
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@torch.no_grad()
def max_logit_diff(ours, reference, prompts: list[list[int]]) -> float:
    worst = 0.0
    for ids in prompts:
        x = torch.tensor([ids])
        worst = max(worst, float((ours(x) - reference(x).logits).abs().max()))
    return worst


def decode_rate(model, prompts: list[list[int]], batch: int, new_tokens: int, eos: int) -> tuple[float, list]:
    """Tokens/s of ``generate`` (greedy) over ``batch`` rows cycling through ``prompts``; and the first rows."""
    rows = [prompts[i % len(prompts)] for i in range(batch)]
    start = time.perf_counter()
    out = generate(model, rows, max_new_tokens=new_tokens, temperature=0.0, stop_tokens=[eos], stop_early=False)
    seconds = time.perf_counter() - start
    return batch * new_tokens / seconds, out.tokens[: len(prompts)]


_shown: set[str] = set()


def show(record: dict) -> None:
    """Print the entries of ``record`` not printed yet (progress on a slow machine)."""
    for key, value in record.items():
        if key not in _shown:
            _shown.add(key)
            print(f"{key}: {json.dumps(value, indent=2) if isinstance(value, dict) else value}", flush=True)


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="directory written by nibble import-model")
    parser.add_argument("--gguf", type=Path, help="the GGUF it was imported from (also compare against it)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "imported_model_cpu.json")
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(str(args.checkpoint))
    prompts = [as_ids(p) for p in chat_prompts(tokenizer)]
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    config = load_config(args.checkpoint)
    bf16_plan = PrecisionPlan(num_layers=config.num_hidden_layers, format="bf16")
    nvfp4_plan = PrecisionPlan(num_layers=config.num_hidden_layers, quantize="all_linear")
    ours = from_pretrained(args.checkpoint, plan=bf16_plan).eval()
    reference = AutoModelForCausalLM.from_pretrained(str(args.checkpoint), dtype=torch.float32).eval()
    record: dict = {
        "benchmark": "imported_model_cpu",
        "checkpoint": str(args.checkpoint),
        "architecture": config.architecture,
        "parameters": ours.num_parameters(),
        "prompt_tokens": [len(p) for p in prompts],
        "max_abs_logit_diff_vs_transformers_same_checkpoint": max_logit_diff(ours, reference, prompts),
    }
    show(record)
    del reference
    if args.gguf is not None:
        source = AutoModelForCausalLM.from_pretrained(
            str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32
        ).eval()
        record["max_abs_logit_diff_vs_transformers_gguf_float32"] = max_logit_diff(ours, source, prompts)
        show(record)
        del source
    nvfp4 = from_pretrained(args.checkpoint, plan=nvfp4_plan).eval().pack()
    with torch.no_grad():
        x = torch.tensor([prompts[0]])
        record["max_abs_logit_diff_nvfp4_all_linear_vs_bf16"] = float((nvfp4(x) - ours(x)).abs().max())
    show(record)
    for name, model in (("bf16", ours.pack()), ("nvfp4_all_linear", nvfp4)):
        rate, replies = decode_rate(model, prompts, args.batch, args.new_tokens, eos)
        texts = [tokenizer.decode(r, skip_special_tokens=True) for r in replies]
        record[name] = {"decode_tokens_per_second": rate, "batch": args.batch, "new_tokens": args.new_tokens}
        record[name]["greedy_replies"] = dict(zip(QUESTIONS, texts, strict=True))
        show(record)
    record["machine"] = describe()
    write_record(args.out, record)


if __name__ == "__main__":
    main()
