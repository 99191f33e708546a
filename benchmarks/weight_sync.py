"""Weight sync on loopback: publish-to-applied latency and fetch GB/s per sampler, 1/2/4 samplers.

A synthetic Qwen-MoE-shaped state dict of ≈ ``--gb`` GB of bf16 weights (fused expert stacks, attention,
embeddings) is published by this process to a weight-sync service started as its own process
(``python -m nibble.weightsync``); each sampler is its own process too, watching, fetching (verified)
and applying (copying into preallocated tensors, as ``load_sampler_state`` does). Both an NVFP4 plan
(weight-sync quantises the experts once) and a bf16 plan (nothing quantised: the stream is the whole
≈ 1 GB) are measured. Target from the weights issue: ≥ 1 GB/s per sampler stream. Records JSON with the
machine in benchmarks/results/weight_sync.json.

    .venv/bin/python -m benchmarks.weight_sync [--gb 1.0] [--samplers 1,2,4] [--rounds 3] [--plans nvfp4,bf16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from benchmarks.machine import describe, write_record
from nibble.recipe import PrecisionPlan
from nibble.transport.weights import GrpcWeightPublisher, GrpcWeightSubscriber

TARGET_GBPS = 1.0
PUBLISH_TOKEN, FETCH_TOKEN = "bench-publish", "bench-fetch"


def synthetic_state(gb: float, hidden: int = 1024, experts: int = 16, vocab: int = 32768) -> dict[str, torch.Tensor]:
    """Qwen-MoE-shaped bf16 weights: per layer attention, norms, router and fused expert stacks."""
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    state = {"model.embed_tokens.weight": w(vocab, hidden), "lm_head.weight": w(vocab, hidden)}
    per_layer = 2 * (4 * hidden * hidden + 3 * experts * hidden * hidden)
    layers = max(1, round((gb * 1e9 - 2 * 2 * vocab * hidden) / per_layer))
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[p + f"self_attn.{proj}.weight"] = w(hidden, hidden)
        state[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
        state[p + "mlp.gate.weight"] = w(experts, hidden)
        state[p + "mlp.experts.gate_up_proj"] = w(experts, 2 * hidden, hidden)
        state[p + "mlp.experts.down_proj"] = w(experts, hidden, hidden)
    state["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    return state


def sampler(target: str, after: int, rounds: int, results: mp.Queue, ready: mp.Event) -> None:
    """One sampler process: watch, fetch, apply ``rounds`` versions; report timestamps (unix seconds)."""
    torch.set_num_threads(1)
    subscriber = GrpcWeightSubscriber(target, FETCH_TOKEN, sampler_id=f"bench-{os.getpid()}")
    subscriber.latest_version()  # connected before the first publication
    ready.set()
    applied: dict[str, torch.Tensor] = {}
    for index, announcement in enumerate(subscriber.watch(after)):
        announced = time.time()
        manifest, tensors = subscriber.fetch(announcement.policy_version)
        fetched = time.time()
        if {n: (t.dtype, t.shape) for n, t in tensors.items()} != {n: (t.dtype, t.shape) for n, t in applied.items()}:
            applied = {name: torch.empty_like(t) for name, t in tensors.items()}  # a new layout (plan) only
        for name, tensor in tensors.items():
            applied[name].copy_(tensor)
        done = time.time()
        del tensors
        results.put(
            {
                "version": announcement.policy_version,
                "announced": announced,
                "fetched": fetched,
                "applied": done,
                "bytes": manifest.total_bytes,
            }
        )
        if index + 1 == rounds:
            break
    subscriber.close()


def start_service(store: Path, threads: int, log: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    config = store.parent / "weightsync.yaml"
    settings = {"port": 0, "publish_port": 0, "store_dir": str(store), "keep_versions": 2, "threads": threads}
    config.write_text(yaml.safe_dump({"weightsync": settings}))
    env = {**os.environ, "NIBBLE_PUBLISH_TOKEN": PUBLISH_TOKEN, "NIBBLE_FETCH_TOKEN": FETCH_TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "nibble.weightsync", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=open(log, "w"),  # noqa: SIM115 (the child holds it)
        env=env,
        text=True,
    )
    line = process.stdout.readline().split()
    if not line or line[0] != "READY":
        raise RuntimeError(f"weight-sync did not start: {line}")
    return process, {k: int(v) for k, v in (field.split("=") for field in line[1:])}


def run_case(publisher, state, plan, target, version, samplers, rounds) -> tuple[list[dict], int]:
    """Publish ``rounds`` versions to ``samplers`` sampler processes; per-round, per-sampler timings."""
    ctx = mp.get_context("spawn")
    results, rows = ctx.Queue(), []
    readies = [ctx.Event() for _ in range(samplers)]
    procs = [ctx.Process(target=sampler, args=(target, version, rounds, results, r)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(120)
    for _ in range(rounds):
        version += 1
        start = time.time()
        publisher.publish(version, state, plan)
        published = time.time()
        for _ in range(samplers):
            r = results.get(timeout=600)
            rows.append(
                {
                    "version": r["version"],
                    "publish_call_s": published - start,
                    "announce_s": r["announced"] - start,
                    "fetch_s": r["fetched"] - r["announced"],
                    "apply_s": r["applied"] - r["fetched"],
                    "publish_to_applied_s": r["applied"] - start,
                    "wire_bytes": r["bytes"],
                    "fetch_gbps": r["bytes"] / (r["fetched"] - r["announced"]) / 1e9,
                }
            )
    for p in procs:
        p.join(60)
    return rows, version


def server_timings(log: Path) -> dict[int, dict]:
    """Per version, from weight-sync's log: seconds spent quantising and storing before the announcement."""
    pattern = re.compile(r"version (\d+) announced: .* quantised in ([\d.]+) s, stored in ([\d.]+) s")
    return {
        int(m[1]): {"quantise_s": float(m[2]), "store_s": float(m[3])}
        for m in map(pattern.search, log.read_text().splitlines())
        if m
    }


def summarise(rows: list[dict]) -> dict:
    keys = ("publish_call_s", "announce_s", "quantise_s", "store_s", "fetch_s", "apply_s", "publish_to_applied_s")
    keys += ("fetch_gbps",)
    out = {f"median_{k}": statistics.median(r[k] for r in rows) for k in keys}
    out["min_fetch_gbps"] = min(r["fetch_gbps"] for r in rows)
    first = min(r["version"] for r in rows)  # each sampler's first fetch also touches its receive buffer first
    out["first_round_median_fetch_gbps"] = statistics.median(r["fetch_gbps"] for r in rows if r["version"] == first)
    out["wire_bytes"] = rows[0]["wire_bytes"]
    out["meets_target"] = out["median_fetch_gbps"] >= TARGET_GBPS
    return out


def quantised_part(state: dict[str, torch.Tensor], plan: PrecisionPlan, cases: dict) -> dict:
    """Bytes of the plan's quantised weights as published (bf16) and as served (NVFP4 codes, block and
    global scales, alignment padding): the NVFP4 stream less the weights that stay bf16."""
    quantised = sum(t.nbytes for n, t in state.items() if plan.format_of(n) != "bf16")
    stays_bf16 = sum(t.nbytes for t in state.values()) - quantised
    nvfp4 = next(c["wire_bytes"] for c in cases.values() if c["plan"] == "nvfp4") - stays_bf16
    return {"bf16_bytes": quantised, "nvfp4_bytes": nvfp4, "ratio": nvfp4 / quantised}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="bf16 weights published (GB)")
    parser.add_argument("--samplers", default="1,2,4", help="concurrent sampler counts")
    parser.add_argument("--plans", default="nvfp4,bf16", help="precision plans measured (nvfp4, bf16)")
    parser.add_argument("--rounds", type=int, default=3, help="versions published per case")
    parser.add_argument("--threads", type=int, default=1, help="weight-sync's torch threads (quantisation)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "weight_sync.json")
    args = parser.parse_args()

    state = synthetic_state(args.gb)
    layers = 1 + max(int(n.split(".")[2]) for n in state if n.startswith("model.layers."))
    every_plan = {"nvfp4": PrecisionPlan(num_layers=layers), "bf16": PrecisionPlan(num_layers=layers, format="bf16")}
    plans = {name: every_plan[name] for name in args.plans.split(",")}
    total = sum(t.nbytes for t in state.values())
    print(f"state: {len(state)} tensors, {total / 1e9:.3f} GB bf16, {layers} layers")
    cases, version = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "weightsync.log"
        service, ports = start_service(Path(tmp) / "store", args.threads, log)
        try:
            publisher = GrpcWeightPublisher(f"127.0.0.1:{ports['publish_port']}", PUBLISH_TOKEN)
            target = f"127.0.0.1:{ports['port']}"
            for plan_name, plan in plans.items():
                for n in (int(s) for s in args.samplers.split(",")):
                    rows, version = run_case(publisher, state, plan, target, version, n, args.rounds)
                    timings = server_timings(log)
                    rows = [{**row, **timings[row["version"]]} for row in rows]
                    cases[f"{plan_name}_x{n}"] = {"samplers": n, "plan": plan_name, **summarise(rows), "rounds": rows}
                    s = cases[f"{plan_name}_x{n}"]
                    print(
                        f"{plan_name:5s} x{n}: publish-to-applied {s['median_publish_to_applied_s']:.2f} s "
                        f"(quantise {s['median_quantise_s']:.2f} s, store {s['median_store_s']:.2f} s, "
                        f"announced at {s['median_announce_s']:.2f} s, fetch {s['median_fetch_s']:.2f} s, "
                        f"apply {s['median_apply_s']:.2f} s); {s['wire_bytes'] / 1e9:.3f} GB on the wire at "
                        f"{s['median_fetch_gbps']:.2f} GB/s per sampler",
                        flush=True,
                    )
            publisher.close()
        finally:
            service.terminate()
            service.wait(30)
    record = {
        "benchmark": "weight_sync",
        "published_bf16_bytes": total,
        "quantised_part": quantised_part(state, plans["nvfp4"], cases) if "nvfp4" in plans else None,
        "target_fetch_gbps_per_sampler": TARGET_GBPS,
        "weightsync_threads": args.threads,
        "machine": describe(),
        "cases": cases,
    }
    write_record(args.out, record)


if __name__ == "__main__":
    main()
