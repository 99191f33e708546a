"""Step times from a stability grid's results (``nibble simulate --calibrate RESULTS.json``): which variants
give which key, what stays as it was, files from before step times were recorded, and bad fields."""

import copy
import json
import random
from pathlib import Path
from statistics import fmean

import pytest

from nibble.simulator import load, published

REPO = Path(__file__).resolve().parents[3]
CPU_GRID = REPO / "benchmarks" / "results" / "stability.json"


def grid(seed: int = 0, steps: int = 4) -> dict:
    """Every variant of the grid × two seeds with random step seconds (and an evaluation every other step)."""
    from benchmarks.stability.variants import VARIANTS

    rng = random.Random(seed)
    runs = []
    for variant in VARIANTS:
        for s in (0, 1):
            records = []
            for i in range(1, steps + 1):
                records.append({
                    "step": i, "grad_norm": 1.0, "generate_seconds": rng.uniform(1, 3),
                    "train_seconds": rng.uniform(0.2, 1), "publish_seconds": rng.uniform(0.01, 0.1),
                    "eval_seconds": rng.uniform(1, 2) if i % 2 == 0 else None,
                })  # fmt: skip
            runs.append({"variant": variant, "seed": s, "steps": records})
    return {"benchmark": "stability", "machine": {"gpu": "NVIDIA H200"}, "setting": {"max_new_tokens": 256},
            "variants": copy.deepcopy(VARIANTS), "runs": runs}  # fmt: skip


def write(tmp_path: Path, data: dict, name: str = "grid.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def mean_of(data: dict, variants: tuple[str, ...], field: str) -> float:
    return fmean(s[field] for r in data["runs"] if r["variant"] in variants for s in r["steps"])


def test_rollout_and_train_times_come_from_the_variants_whose_plan_matches(tmp_path):
    data = grid()
    calibration = load([write(tmp_path, data)])
    expected_rollout = {
        "bf16": ("bf16",), "mxfp8": ("mxfp8",), "nvfp4": ("nvfp4_naive", "nvfp4_deq"),
        "nvfp4_4o6": ("nvfp4_4o6", "nvfp4_4o6_deq"),
    }  # fmt: skip
    for key, variants in expected_rollout.items():
        assert calibration.rollout_seconds[key] == pytest.approx(mean_of(data, variants, "generate_seconds"))
        # the pause of a format is its own runs' publish time, not all runs' (per format, not pooled)
        assert calibration.weight_sync_seconds[key] == pytest.approx(mean_of(data, variants, "publish_seconds"))
        runs = f"over {8 * len(variants)} steps of {2 * len(variants)} runs of {', '.join(variants)}"
        assert f"mean publish_seconds {runs}" in calibration.sources[f"weight_sync.{key}"]
        assert "H200" in calibration.sources[f"rollout.{key}"] and "256 tokens" in calibration.sources[f"rollout.{key}"]
        assert ", ".join(variants) in calibration.sources[f"rollout.{key}"]
    expected_train = {
        "bf16": ("bf16",), "mxfp8_dequantized": ("mxfp8",), "nvfp4_high_precision": ("nvfp4_naive",),
        "nvfp4_dequantized": ("nvfp4_deq",),
    }  # fmt: skip
    for key, variants in expected_train.items():
        assert calibration.train_seconds[key] == pytest.approx(mean_of(data, variants, "train_seconds"))
    base = published()
    # no grid variant has an MXFP8 high-precision backward; floors are never read from a stability file
    assert calibration.train_seconds["mxfp8_high_precision"] == base.train_seconds["mxfp8_high_precision"]
    assert calibration.floors == base.floors
    assert calibration.sources["floors.nvfp4"] == base.sources["floors.nvfp4"]


def test_a_file_from_before_step_times_is_refused_and_its_timed_runs_count_once_appended(tmp_path):
    with pytest.raises(ValueError, match=r"stability\.json: holds no number to calibrate from .*generate_seconds"):
        load([CPU_GRID])
    old = json.loads(CPU_GRID.read_text())
    timed = {**grid(steps=3)["runs"][0], "seed": 5}  # bf16, a seed the old runs lack (--append skips the others)
    assert timed["variant"] == "bf16"
    appended = write(tmp_path, {**old, "runs": [*old["runs"], timed]})
    calibration = load([appended])
    assert calibration.rollout_seconds["bf16"] == pytest.approx(fmean(s["generate_seconds"] for s in timed["steps"]))
    assert "over 3 steps of 1 runs of bf16" in calibration.sources["rollout.bf16"]
    assert calibration.rollout_seconds["nvfp4"] == published().rollout_seconds["nvfp4"]


def test_a_later_file_wins_and_a_stability_file_keeps_earlier_floors(tmp_path):
    floors = write(tmp_path, {"floors": {"nvfp4": 0.05}, "step_seconds": {"rollout": {"bf16": 99.0}}}, "floors.json")
    calibration = load([floors, write(tmp_path, grid())])
    assert calibration.sources["floors.nvfp4"].startswith(str(floors))
    assert calibration.rollout_seconds["bf16"] != 99.0


def broken(change) -> dict:
    data = grid(steps=2)
    change(data)
    return data


def drop_times(d: dict) -> None:
    for name in ("generate_seconds", "train_seconds", "publish_seconds"):
        d["runs"][1]["steps"][0].pop(name)


STEP = r"runs\[{}\]\.steps\[{}\]"
BAD = [
    (lambda d: d["runs"][0]["steps"][1].pop("train_seconds"), STEP.format(0, 1) + ": field 'train_seconds' is missing"),
    (lambda d: d["runs"][3]["steps"][0].update(generate_seconds=-1.0), STEP.format(3, 0) + r"\.generate_seconds'"),
    (lambda d: d["runs"][2]["steps"][0].update(publish_seconds="1"), STEP.format(2, 0) + r"\.publish_seconds'"),
    (drop_times, r"runs\[1\] times some steps but not others"),
    (lambda d: d["runs"][0].update(variant="nvfp4_magic"), r"'runs\[0\]\.variant' must be one of"),
    (lambda d: d["variants"]["bf16"].update(colour="red"), r"'variants\.bf16\.colour' is unknown"),
    (lambda d: d["variants"]["recipe"].update(backward="up"), r"'variants\.recipe\.backward' must be one of"),
    (lambda d: d["variants"]["recipe"].update(bf16_last_fraction=2), r"'variants\.recipe\.bf16_last_fraction' must"),
    (lambda d: d["variants"]["bf16"].pop("format"), r"'variants\.bf16\.format' is missing"),
    (lambda d: d.update(runs=[]), r"field 'runs' must be a non-empty list"),
    (lambda d: d["runs"][0].update(steps=[]), r"'runs\[0\]\.steps' must be a non-empty list"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_bad_fields_are_named_with_the_file(tmp_path, change, message):
    path = write(tmp_path, broken(change))
    with pytest.raises(ValueError, match=rf"grid\.json: .*{message}"):
        load([path])


def test_timed_runs_of_no_matching_variant_give_nothing_to_calibrate(tmp_path):
    data = grid(steps=2)
    data["runs"] = [r for r in data["runs"] if r["variant"] == "recipe"]
    with pytest.raises(ValueError, match=r"holds no number to calibrate from \(its timed variants \(recipe\) match no"):
        load([write(tmp_path, data)])


def h200_pair(bf16_publish: float = 0.16, nvfp4_publish: float = 1.13) -> dict:
    """bf16 and nvfp4_naive, one run each on an "H200", publishing in the seconds given (the H200 grid's)."""
    from benchmarks.stability.variants import VARIANTS

    def run(variant: str, publish: float) -> dict:
        times = {"generate_seconds": 1.5, "train_seconds": 0.5, "publish_seconds": publish, "eval_seconds": None}
        steps = [{"step": i, "grad_norm": 1.0, **times} for i in (1, 2)]
        return {"variant": variant, "seed": 0, "steps": steps}

    variants = {name: copy.deepcopy(VARIANTS[name]) for name in ("bf16", "nvfp4_naive")}
    return {"benchmark": "stability", "machine": {"gpu": "NVIDIA H200"}, "variants": variants,
            "runs": [run("bf16", bf16_publish), run("nvfp4_naive", nvfp4_publish)]}  # fmt: skip


def test_bf16_and_nvfp4_runs_calibrate_two_pauses_and_other_formats_keep_theirs(tmp_path):
    earlier = write(tmp_path, {"step_seconds": {"weight_sync": {"mxfp8": 3.0}}}, "earlier.json")
    calibration = load([earlier, write(tmp_path, h200_pair())])
    assert calibration.weight_sync_seconds["bf16"] == pytest.approx(0.16)
    assert calibration.weight_sync_seconds["nvfp4"] == pytest.approx(1.13)  # not the pooled 0.645
    # no run of these formats: mxfp8 keeps the earlier file's pause, NVFP4 + 4/6 the published one
    assert calibration.weight_sync_seconds["mxfp8"] == 3.0 and calibration.sources["weight_sync.mxfp8"].startswith(
        str(earlier)
    )
    assert calibration.weight_sync_seconds["nvfp4_4o6"] == published().weight_sync_seconds["nvfp4_4o6"]
    assert calibration.sources["weight_sync.nvfp4_4o6"] == published().sources["weight_sync.nvfp4_4o6"]


def test_each_number_names_the_load_its_runs_ran_under_and_a_file_of_mixed_loads_is_flagged(tmp_path):
    data = h200_pair()
    pair = [[run["variant"], run["seed"]] for run in data["runs"]]
    data["parts"] = [{"machine": {"gpu": "NVIDIA H200", "devices": ["cuda:0", "cuda:0"]}, "runs": pair}]
    sources = load([write(tmp_path, data)]).sources
    old = ", NVFP4 GEMMs before docs/design.md §2.6 (unrecorded), weight-sync quantise on the CPU (unrecorded)"
    assert sources["rollout.nvfp4"].endswith(f"(2 runs at a time per GPU{old})")  # a record before both fields
    assert "WARNING" not in sources["rollout.bf16"]
    # a later part ran the nvfp4 run three to a GPU under MPS: the BF16/NVFP4 ratio is partly the load's
    data["parts"] = [
        {"machine": {"gpu": "NVIDIA H200", "devices": ["cuda:0", "cuda:0"]}, "runs": pair[:1]},
        {"machine": {"gpu": "NVIDIA H200", "devices": ["cuda:0"] * 3, "cuda_mps": True}, "runs": pair[1:]},
    ]
    sources = load([write(tmp_path, data, "mixed.json")]).sources
    assert sources["rollout.nvfp4"].endswith(f"(3 runs at a time per GPU, CUDA MPS{old})")
    for name in ("rollout.bf16", "rollout.nvfp4", "weight_sync.bf16", "train.bf16"):
        assert "WARNING: its timed runs ran under different loads" in sources[name]
        assert f"2 runs at a time per GPU{old} / 3 runs at a time per GPU, CUDA MPS{old}" in sources[name]
    # a later part ran the block-ordered NVFP4 GEMMs (its record names them), the earlier one the GEMM before
    block_ordered = "block-ordered (docs/design.md §2.6), CUDA fragment kernels"
    data["parts"] = [
        {"machine": {"gpu": "NVIDIA H200", "devices": ["cuda:0", "cuda:0"]}, "runs": pair[:1]},
        {"machine": {"gpu": "NVIDIA H200", "devices": ["cuda:0", "cuda:0"], "nvfp4_gemm": block_ordered},
         "runs": pair[1:]},
    ]  # fmt: skip
    sources = load([write(tmp_path, data, "gemms.json")]).sources
    assert sources["rollout.nvfp4"].endswith(
        f"(2 runs at a time per GPU, NVFP4 GEMMs {block_ordered}, weight-sync quantise on the CPU (unrecorded))"
    )
    assert "WARNING: its timed runs ran under different loads" in sources["rollout.bf16"]
    # a later part quantised its publications on the GPU (its record says where), the earlier one on the CPU
    data["parts"][1]["machine"]["publish_quantize"] = "on the run's device"
    sources = load([write(tmp_path, data, "publish.json")]).sources
    assert sources["weight_sync.nvfp4"].endswith(", weight-sync quantise on the run's device)")
    assert "WARNING: its timed runs ran under different loads" in sources["weight_sync.bf16"]
    # a file without parts takes its one machine record; one without any says so
    del data["parts"]
    data["machine"] = {"cpu": "x", "workers": 2}
    assert load([write(tmp_path, data, "cpu.json")]).sources["train.bf16"].endswith("(2 CPU worker processes)")
    del data["machine"]
    assert load([write(tmp_path, data, "none.json")]).sources["train.bf16"].endswith("(load not recorded)")
