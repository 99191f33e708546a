"""Ctrl-C on ``nibble run``, then ``--resume``: real processes, a real redis-server, real gRPC.

SIGINT stops the children in dependency order (samplers, trainer with a final checkpoint, weight-sync,
Redis) within a bound, with no traceback anywhere; the folder then refuses a plain re-run, ``--resume``
finishes the run, and the summary accounts for both segments.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.launcher.stack import metrics_lines, wait_for_step
from tests.services import run_launcher, stop_launcher

ROOT = Path(__file__).resolve().parents[2]
NIBBLE = str(Path(sys.executable).with_name("nibble"))
TOTAL_STEPS = 5
STOP_BOUND_SECONDS = 60  # measured 2-4 s on an idle 2-core machine; CI's cores are shared and busy


def nibble_run(out: Path, *flags: str) -> list[str]:
    return [NIBBLE, "run", "--config", str(ROOT / "configs" / "smoke.yaml"), "--out", str(out), *flags]


def environment(warm_start: Path, **extra: str) -> dict[str, str]:
    # checkpoint_every 2: a trainer stopped after an odd step must write the checkpoint itself
    base = {
        "NIBBLE_MODEL__CHECKPOINT": str(warm_start),
        "NIBBLE_TRAINER__TOTAL_STEPS": str(TOTAL_STEPS),
        "NIBBLE_TRAINER__CHECKPOINT_EVERY": "2",
    }
    return {**os.environ, **base, **extra}


def children(pid: int) -> dict[int, str]:
    """The direct child processes of ``pid`` (from /proc), named as the launcher names them."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError):
            continue
        if int(fields[1]) != pid:
            continue
        if any("redis-server" in a for a in argv):
            found[int(stat.parent.name)] = "redis"
        elif "--name" in argv:
            found[int(stat.parent.name)] = argv[argv.index("--name") + 1]
        else:
            found[int(stat.parent.name)] = next(a.split(".")[-1] for a in argv if a.startswith("nibble."))
    return found


def watch_exits(pids: dict[int, str], until: threading.Event) -> dict[str, float]:
    """Start a thread noting when each process exits (a zombie or gone); the dict fills as they do."""
    exits: dict[str, float] = {}

    def poll() -> None:
        while len(exits) < len(pids) and not until.is_set():
            now = time.monotonic()  # one time per pass: exits seen in one pass count as simultaneous
            for pid, name in pids.items():
                if name in exits:
                    continue
                try:
                    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                except OSError:
                    state = "gone"
                if state in ("Z", "X", "gone"):
                    exits[name] = now
            time.sleep(0.005)

    threading.Thread(target=poll, daemon=True).start()
    return exits


@pytest.fixture(scope="module")
def interrupted(warm_start, tmp_path_factory):
    out = tmp_path_factory.mktemp("interrupt") / "run"
    launcher = subprocess.Popen(
        nibble_run(out),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(warm_start),
    )

    def alive() -> None:
        if launcher.poll() is not None:
            raise AssertionError(f"nibble run exited early: {launcher.communicate()}")

    try:
        wait_for_step(out, 1, timeout=300, alive=alive)
        pids = children(launcher.pid)
        done = threading.Event()
        exits = watch_exits(pids, done)
        sent = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=300)
        seconds = time.monotonic() - sent
        done.set()
    finally:
        if launcher.poll() is None:  # stopped with Ctrl-Cs: a bare kill would leave its children running
            stop_launcher(launcher)
    return SimpleNamespace(out=out, code=launcher.returncode, stdout=stdout, stderr=stderr, seconds=seconds,
                           names=sorted(pids.values()), exits={k: v - sent for k, v in exits.items()})  # fmt: skip


def test_ctrl_c_stops_every_child_in_dependency_order_quickly(interrupted):
    run = interrupted
    assert run.code == 130, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.names == ["redis", "sampler-0", "sampler-1", "trainer", "weightsync"]
    assert set(run.exits) == set(run.names), run.exits
    samplers = max(run.exits["sampler-0"], run.exits["sampler-1"])
    assert samplers <= run.exits["trainer"] <= run.exits["weightsync"] <= run.exits["redis"], run.exits
    assert run.seconds < STOP_BOUND_SECONDS, run.seconds
    said = [line for line in run.stdout.splitlines() if line.startswith("stopping ")]
    assert said == ["stopping samplers (sampler-0, sampler-1)", "stopping trainer", "stopping weightsync",
                    "stopping redis"], run.stdout[-3000:]  # fmt: skip
    assert f"continue with: nibble run --out {run.out} --resume" in run.stdout


def test_no_log_or_output_holds_a_traceback(interrupted):
    run = interrupted
    assert "Traceback" not in run.stdout + run.stderr
    for log in (run.out / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name


def test_the_trainer_checkpointed_its_last_step(interrupted):
    run = interrupted
    recorded = max(x["step"] for x in metrics_lines(run.out))
    latest = (run.out / "trainer" / "latest").read_text().strip()
    assert latest == f"step-{recorded:08d}"
    assert "stopped at step" in (run.out / "logs" / "trainer.log").read_text()
    segments = json.loads((run.out / "run.json").read_text())["segments"]
    assert [s["status"] for s in segments] == ["stopped"] and segments[0]["last_step"] == recorded
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["steps"] == recorded


@pytest.fixture(scope="module")
def resumed(interrupted, warm_start):
    run = interrupted
    before = {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file()}
    plain = run_launcher(nibble_run(run.out), timeout=120, env=environment(warm_start))
    unchanged = before == {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file()}
    again = run_launcher(nibble_run(run.out, "--resume"), timeout=600, env=environment(warm_start))
    return SimpleNamespace(plain=plain, unchanged=unchanged, again=again)


def test_a_plain_rerun_refuses_the_unfinished_folder_and_touches_nothing(interrupted, resumed):
    assert resumed.plain.returncode == 2 and resumed.unchanged
    assert f"{interrupted.out} holds an unfinished run" in resumed.plain.stderr
    assert "--resume continues it" in resumed.plain.stderr


def test_resume_finishes_the_run_and_the_summary_covers_both_segments(interrupted, resumed):
    done = resumed.again
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = interrupted.out
    assert "resuming the run in" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    segments = summary["segments"]
    assert [s["status"] for s in segments] == ["stopped", "finished"]
    assert summary["steps"] == TOTAL_STEPS and summary["status"] == "finished"
    assert summary["wall_seconds"] == pytest.approx(sum(s["ended_at"] - s["started_at"] for s in segments))
    assert all(s["sampler_tokens"] > 0 for s in segments)
    tokens = sum(s["sampler_tokens"] for s in segments)
    assert summary["sampler_tokens_per_second"] == pytest.approx(tokens / summary["wall_seconds"])
    assert "over 2 segments" in done.stdout


@pytest.mark.parametrize(
    ("flags", "code", "said"),
    [
        ((), 2, "holds a finished run (step 5/5); left untouched"),
        (("--resume",), 0, "nothing to resume, left untouched"),
    ],
)
def test_a_finished_folder_is_never_rewritten(interrupted, resumed, warm_start, flags, code, said):
    assert resumed.again.returncode == 0
    out = interrupted.out
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = subprocess.run(nibble_run(out, *flags), capture_output=True, text=True, timeout=120,
                            env=environment(warm_start))  # fmt: skip
    assert result.returncode == code and said in result.stdout + result.stderr, result.stdout + result.stderr
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}  # summary.json byte-identical


def test_resume_refuses_another_config(interrupted, resumed, warm_start):
    assert resumed.again.returncode == 0
    env = environment(warm_start, NIBBLE_TRAINER__LEARNING_RATE="1e-3")
    result = subprocess.run(nibble_run(interrupted.out, "--resume"), capture_output=True, text=True,
                            timeout=120, env=env)  # fmt: skip
    assert result.returncode == 2
    assert "trainer.learning_rate 0.0002 → 0.001 (set by NIBBLE_TRAINER__LEARNING_RATE)" in result.stderr
