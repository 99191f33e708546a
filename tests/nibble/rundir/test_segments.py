"""A run's segments: every launch's wall-clock and sampler output count in the summary, none twice."""

import json
import time

import pytest

from nibble.analysis.run_report import describe, read_lines, summarize
from nibble.config import load
from nibble.rundir import RunRecord


def sampler_file(out, name, tokens, started_at):
    (out / "samplers").mkdir(exist_ok=True)
    record = {"tokens": tokens, "groups_written": tokens // 10, "started_at": started_at, "updated_at": started_at + 1}
    (out / "samplers" / f"{name}.json").write_text(json.dumps(record))


def steps(out, numbers, tokens=100):
    with (out / "metrics.jsonl").open("a") as handle:
        for k in numbers:
            line = {"step": k, "reward_mean": 0.5, "trained_tokens": tokens, "idle_seconds": 0.0, "policy_version": k}
            handle.write(json.dumps(line) + "\n")


def test_a_resumed_run_accounts_for_both_segments(tmp_path):
    record = RunRecord(config={})
    first = record.begin(tmp_path, 0)
    sampler_file(tmp_path, "sampler-0", 3000, first.started_at + 0.1)
    steps(tmp_path, [1, 2, 3])
    record.close(tmp_path, "stopped")
    second = record.begin(tmp_path, 3)
    # the resumed sampler-0 overwrites its counter file: the first segment's tokens live in run.json now
    sampler_file(tmp_path, "sampler-0", 1000, second.started_at + 0.1)
    steps(tmp_path, [3, 4])  # step 3 recorded twice: the first trainer stopped before checkpointing it
    record.close(tmp_path, "finished")

    saved = RunRecord.read(tmp_path)
    saved.segments[0].started_at, saved.segments[0].ended_at = 1000.0, 1030.0  # 30 s, a pause, then 10 s
    saved.segments[1].started_at, saved.segments[1].ended_at = 1100.0, 1110.0
    assert [s.status for s in saved.segments] == ["stopped", "finished"]
    assert [s.sampler_tokens for s in saved.segments] == [3000, 1000]
    assert [(s.first_step, s.last_step) for s in saved.segments] == [(0, 3), (3, 4)]
    config = load(None, {"NIBBLE_TRAINER__TOTAL_STEPS": "4"})
    summary = summarize(tmp_path, config, saved.segments)
    wall = 40.0
    assert summary["steps"] == 4 and summary["status"] == "finished"
    assert summary["wall_seconds"] == pytest.approx(wall)
    assert summary["sampler_tokens_per_second"] == pytest.approx(4000 / wall)
    assert summary["trainer_tokens_per_second"] == pytest.approx(400 / wall)
    assert summary["elapsed_seconds"] == 110.0 and len(summary["segments"]) == 2
    assert describe(summary)[0] == "finished 4/4 steps in 40.0 s over 2 segments"


def test_a_segment_whose_launcher_died_is_closed_by_the_next(tmp_path):
    record = RunRecord(config={})
    dead = record.begin(tmp_path, 0)
    sampler_file(tmp_path, "sampler-0", 500, dead.started_at + 1)
    steps(tmp_path, [1])
    record = RunRecord.read(tmp_path)  # a new launcher reads what the dead one left
    record.begin(tmp_path, 1)
    killed = RunRecord.read(tmp_path).segments[0]
    assert killed.status == "killed" and killed.sampler_tokens == 500 and killed.last_step == 1
    assert killed.ended_at == pytest.approx(dead.started_at + 2)  # its samplers' last word


def test_the_last_record_of_a_step_wins_and_torn_lines_are_skipped(tmp_path):
    steps(tmp_path, [1, 2])
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2, "reward_mean": 0.9, "trained_tokens": 1, "idle_seconds": 0, "policy_version": 2}\n')
        handle.write('{"step": 3, "rew')  # a trainer killed mid-line
    lines = read_lines(tmp_path)
    assert [x["step"] for x in lines] == [1, 2] and lines[1]["reward_mean"] == 0.9


def test_a_damaged_record_is_named(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"run\.json: not a run record"):
        RunRecord.read(tmp_path)


def test_segment_statuses_are_checked(tmp_path):
    record = RunRecord(config={})
    record.begin(tmp_path, 0)
    with pytest.raises(ValueError, match="segment status 'done'"):
        record.close(tmp_path, "done")
    assert time.time() >= record.segments[0].started_at
