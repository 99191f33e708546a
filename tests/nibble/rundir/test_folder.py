"""Which folder ``nibble run`` may write: a run there is never overwritten without --resume or --new."""

import json
import multiprocessing
import os

import pytest

from nibble.rundir import RunRecord, State, choose, inspect, locked, next_free


def make_run(path, *, finished: bool, steps: int = 3, total: int = 6):
    """A run folder as the launcher leaves it: metrics, a record with one segment, summary.json."""
    path.mkdir(parents=True)
    lines = [{"step": 0, "eval_accuracy": 0.3}] + [{"step": k} for k in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    record = RunRecord(config={"trainer": {"total_steps": total}})
    record.begin(path, 0)
    record.close(path, "finished" if finished else "stopped")
    (path / "summary.json").write_text(json.dumps({"steps": steps}) + "\n")
    return path


def test_a_missing_or_empty_folder_starts_a_new_run(tmp_path):
    assert choose(tmp_path / "new", resume=False, new=False).state is State.EMPTY
    (tmp_path / "empty").mkdir()
    assert choose(tmp_path / "empty", resume=False, new=False).path == tmp_path / "empty"


def test_a_finished_run_is_refused_without_a_flag_and_named_with_the_way_out(tmp_path):
    run = make_run(tmp_path / "run", finished=True, steps=6)
    with pytest.raises(ValueError) as info:
        choose(run, resume=False, new=False)
    message = str(info.value)
    assert f"{run} holds a finished run (step 6/6); left untouched" in message
    assert f"--new starts a new run in {tmp_path / 'run-2'}" in message
    found = choose(run, resume=True, new=False)  # the CLI then says it is finished and leaves it alone
    assert found.state is State.FINISHED and found.steps == 6 and found.total_steps == 6


def test_an_unfinished_run_needs_resume(tmp_path):
    run = make_run(tmp_path / "run", finished=False, steps=2)
    with pytest.raises(ValueError, match=r"an unfinished run \(step 2/6\); left untouched. --resume continues it"):
        choose(run, resume=False, new=False)
    assert choose(run, resume=True, new=False).state is State.UNFINISHED


def test_new_takes_the_next_free_folder(tmp_path):
    make_run(tmp_path / "run", finished=True)
    make_run(tmp_path / "run-2", finished=False)
    (tmp_path / "run-3").mkdir()  # empty: free
    assert next_free(tmp_path / "run") == tmp_path / "run-3"
    assert choose(tmp_path / "run", resume=False, new=True).path == tmp_path / "run-3"
    assert choose(tmp_path / "fresh", resume=False, new=True).path == tmp_path / "fresh"


@pytest.mark.parametrize(
    ("setup", "flags", "message"),
    [
        (lambda p: None, {"resume": True}, "nothing to resume"),
        (lambda p: (p.mkdir(), (p / "thesis.tex").write_text("x")), {}, "not a Nibble run"),
        (lambda p: None, {"resume": True, "new": True}, "choose one"),
    ],
)
def test_impossible_requests_are_refused_by_name(tmp_path, setup, flags, message):
    setup(tmp_path / "run")
    with pytest.raises(ValueError, match=message):
        choose(tmp_path / "run", resume=flags.get("resume", False), new=flags.get("new", False))


def test_a_folder_from_before_run_records_counts_as_finished_when_it_has_a_summary(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    assert inspect(old).state is State.UNFINISHED
    (old / "summary.json").write_text("{}")
    assert inspect(old).state is State.FINISHED


def _hold(path, ready, release):
    with locked(path):
        ready.set()
        release.wait(30)


def test_two_launchers_never_share_a_folder(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(tmp_path / "run", ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        busy = rf"another nibble run \(pid {holder.pid}\) is writing this folder"
        with pytest.raises(ValueError, match=busy), locked(tmp_path / "run"):
            pass
    finally:
        release.set()
        holder.join(30)
    with locked(tmp_path / "run"):  # released with its holder
        assert inspect(tmp_path / "run").state is State.EMPTY  # the lock file alone is no run
    assert os.listdir(tmp_path / "run") == [".nibble-run.lock"]
