"""The grid's results file: the JSON ``nibble report stability`` reads, written atomically after every
run, and grown in parts (``--append``: a grid run over several sessions into one file)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.stability.setting import Setting, Source
from benchmarks.stability.variants import VARIANTS
from nibble.analysis import stability_events
from nibble.analysis.stability_report import check_marker

ROOT = Path(__file__).resolve().parents[2]


def results_document(runs: list[dict], setting: Setting, source: Source | Path, command: str, wall: float) -> dict:
    """The JSON that ``nibble report stability`` reads (the machine is recorded by the caller);
    ``wall``: seconds the grid (or this part of it) took."""
    source = source if isinstance(source, Source) else Source(Path(source))
    return {
        "benchmark": "stability",
        "command": command,
        "checkpoint": _relative(source.checkpoint),
        "task": source.task,
        "quantize": source.quantize,
        "setting": asdict(setting),
        "definitions": {
            "spike": f"grad norm > {stability_events.SPIKE_FACTOR}x the median of the previous "
            f"{stability_events.SPIKE_WINDOW} steps' finite norms (judged with >= "
            f"{stability_events.SPIKE_MIN_HISTORY} of them); a non-finite norm is a spike",
            "collapse": f"held-out accuracy < warm start - {stability_events.COLLAPSE_DROP} at an evaluation, "
            f"with no evaluation back at or above it within {stability_events.COLLAPSE_PATIENCE} steps",
            "step_seconds": "generate_seconds (the step's generation batches, weight swaps included), "
            "train_seconds (assemble + train_on_batch), publish_seconds (publish and quantise the new version), "
            "eval_seconds (held-out evaluation, null without one): wall-clock seconds, CUDA synchronised",
        },
        "variants": {name: VARIANTS[name] for name in dict.fromkeys(r["variant"] for r in runs)},
        "wall_seconds": wall,
        "runs": runs,
    }


def earlier_part(out: Path, document: dict) -> tuple[list[dict], list[dict]]:
    """The runs already in ``out`` and the parts (command, machine, seconds) that made them, for a grid
    that appends to it (none when ``out`` does not exist).

    Raises:
        ValueError: ``out`` is not a results file (naming what it is when it is another benchmark's record,
            the stability pilots', say), or was made with another checkpoint, task, plan scope or setting
            (naming the first field that differs): runs of two settings are not one grid.
    """
    if not out.exists():
        return [], []
    try:
        earlier = json.loads(out.read_text())
        if isinstance(earlier, dict):
            check_marker(out, earlier)
        runs = earlier["runs"]
        # A list, not any iterable: {} iterates like [] and failed only at the first save, the run lost.
        if not isinstance(runs, list):
            raise TypeError(f"'runs' must be a list of runs, got {type(runs).__name__}")
        if not all(_is_run(r) for r in runs):
            raise TypeError("a run without a string variant, an integer seed and a list of steps")
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{out}: not a stability results file ({type(exc).__name__}: {exc})") from None
    for key in ("checkpoint", "task", "quantize", "setting"):
        mine, theirs = document[key], _with_legacy_defaults(key, earlier.get(key))
        if mine != theirs:
            if isinstance(mine, dict) and isinstance(theirs, dict):
                field = next(k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k))
                key, mine, theirs = f"{key}.{field}", mine.get(field), theirs.get(field)
            raise ValueError(f"{out}: its {key} is {theirs!r}, this grid's is {mine!r}")
    first = {key: earlier.get(key) for key in ("command", "machine", "wall_seconds")}  # a file of one part
    return runs, earlier.get("parts") or [{**first, "runs": [[r["variant"], r["seed"]] for r in runs]}]


def _is_run(run: object) -> bool:
    """Whether ``run`` has what appending reads of it: ``variant`` (a word), ``seed`` (an integer, not a
    bool) and ``steps`` (a list): runs to skip are looked up by ``(variant, seed)``, so either of another type
    failed as a traceback."""
    if not isinstance(run, dict) or not {"variant", "seed", "steps"} <= run.keys():
        return False
    seed = run["seed"]
    return (
        isinstance(run["variant"], str)
        and isinstance(seed, int)
        and not isinstance(seed, bool)
        and isinstance(run["steps"], list)
    )


# Fields a results file written before they existed holds implicitly: every run then used them (the plan's
# default scope, the trainer's default config). Step records gained STEP_SECONDS later too; they are not
# part of the setting, so old and new runs share a grid.
_LEGACY_DEFAULTS = {"quantize": "experts", "setting": {"trainer": {}}}


def _with_legacy_defaults(key: str, value):
    default = _LEGACY_DEFAULTS.get(key)
    if value is None:
        return default
    if isinstance(default, dict) and isinstance(value, dict):
        return {**default, **value}
    return value


_RUNS_MARKER = "\0runs\0"


def dumps(document: dict) -> str:
    """The results as JSON text: indented, with one line per step record (diffable line by line)."""
    # Replacing a marker no results field holds leaves the parts' own "runs" lists alone, even empty ones.
    text = json.dumps({**document, "runs": _RUNS_MARKER}, indent=1)
    runs = []
    for run in document["runs"]:
        head = json.dumps({k: v for k, v in run.items() if k != "steps"})[:-1]
        steps = ",\n".join("   " + json.dumps(step) for step in run["steps"])
        runs.append(f'  {head}, "steps": [\n{steps}\n  ]}}')
    return text.replace(f'"runs": {json.dumps(_RUNS_MARKER)}', '"runs": [\n' + ",\n".join(runs) + "\n ]") + "\n"


def check_writable(out: Path) -> None:
    """Make ``out``'s directory and write a scratch file in it, so that a place a record cannot be written to
    is refused before minutes of measuring, not after them.

    Raises:
        ValueError: naming ``--out`` and the system's reason.
    """
    try:
        out.exists()  # a name the file system refuses (too long, say) raises here, not after the run
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def save(out: Path, document: dict) -> None:
    """Write ``document`` to ``out`` whole or not at all (a temporary file beside it, renamed into place)."""
    with tempfile.NamedTemporaryFile("w", dir=out.parent, prefix=f".{out.name}.", delete=False) as tmp:
        tmp.write(dumps(document))
    Path(tmp.name).replace(out)


def _relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (the JSON is committed)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
