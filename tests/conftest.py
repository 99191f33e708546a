"""Session-wide test configuration: GPU tests skip cleanly on machines without CUDA; one throw-away
Redis serves every test that needs one (each test uses stream and key names of its own)."""

import os

import pytest
import torch

# Without a GPU the Triton kernels run under Triton's interpreter, so CI still checks them bit for bit
# against the reference. The switch is read when kernels are defined, hence before any import of them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.services import RedisServer, redis_config

pytest_plugins = ["tests.heartbeat"]

# Without a GPU, one torch thread in this process for every test: the suite shares the machine's cores with
# the services its tests start, and a test's speed must not depend on whether an in-process run that sets
# one thread (a stability grid, the SFT command) ran before it. (GPU machines keep their threads for the
# CPU references of the GPU tests.)
if not torch.cuda.is_available():
    torch.set_num_threads(1)

# In CI (the CI environment variable set) hypothesis draws the same examples on every run, so that a red CI
# names the change, not the draw: its built-in "ci" profile (derandomize=True, no deadline, no example
# database; hypothesis >= 6.116, pyproject's minimum) is loaded on its own there. Runs elsewhere keep
# exploring new examples.


def pytest_collection_modifyitems(config, items):
    # pytest-xdist hands out tests in collection order: the few that take minutes go first, so that they run
    # beside the short ones instead of alone at the end (a stable sort keeps every other test's order)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run on the H200 machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A ``redis-server`` on a free loopback port (noeviction, no persistence) for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def stream_config(redis_server):
    """A RedisConfig on the session's server with this test's own stream and key names."""
    return redis_config(redis_server.url)


@pytest.fixture(scope="session")
def dense_run_config(tmp_path_factory):
    """A run config over a tiny dense Llama (SmolLM2's layout, random weights) on the addition task, its
    MLPs quantised (``plan.quantize: all_linear``)."""
    from nibble.model import MoETransformer
    from nibble.model.hf import save_pretrained
    from nibble.tasks import get_task
    from tests.helpers import TINY_LLAMA

    root = tmp_path_factory.mktemp("dense")
    with get_task("addition", digits=2) as task:
        vocab = task.tokenizer.vocab_size
    torch.manual_seed(0)
    save_pretrained(MoETransformer(TINY_LLAMA.model_copy(update={"vocab_size": vocab})), root / "model")
    path = root / "run.yaml"
    path.write_text(
        f"model: {{checkpoint: {root / 'model'}}}\n"
        "task: {name: addition, options: {digits: 2, eval_size: 16}}\n"
        "plan: {quantize: all_linear}\n"
    )
    return path


@pytest.fixture(scope="session")
def warm_start(tmp_path_factory, pytestconfig):
    """One ``nibble sft`` warm start per test session (≈ 1 minute), shared by the CLI and service tests:
    the run config's task and target accuracy (which leaves RL room to show). Under pytest-xdist the workers
    share one: the first to need it makes it under a file lock, and a failure is recorded there, so that the
    other workers fail with its message instead of running it again. ``NIBBLE_TEST_WARM_START=DIR`` reuses
    one made earlier (``nibble sft --out DIR``) when iterating on system tests."""
    import os
    import shutil
    from pathlib import Path

    from filelock import FileLock

    if os.environ.get("NIBBLE_TEST_WARM_START"):
        return Path(os.environ["NIBBLE_TEST_WARM_START"])

    # a worker's base folder is a child of the run's own, which the workers share
    shared = tmp_path_factory.getbasetemp()
    if hasattr(pytestconfig, "workerinput"):
        shared = shared.parent
    folder = shared / "warm"
    folder.mkdir(exist_ok=True)
    out, failed = folder / "ckpt", folder / "failed"
    with FileLock(str(folder / "lock")):
        if failed.exists():
            pytest.fail(f"the warm start failed in another worker:\n{failed.read_text()}")
        if not out.exists():
            partial = folder / "partial"
            shutil.rmtree(partial, ignore_errors=True)
            error = _sft_warm_start(partial)
            if error is not None:
                failed.write_text(error)
                pytest.fail(f"the warm start failed:\n{error}")
            partial.rename(out)  # whole or absent: a worker never sees half a checkpoint
    return out


def _sft_warm_start(out):
    """``nibble sft`` into ``out`` with the default run config's task, seed and target accuracy; its stderr
    where it fails, else None."""
    import subprocess
    import sys
    from pathlib import Path

    from nibble.config import load

    config = load(None)
    nibble = str(Path(sys.executable).with_name("nibble"))
    argv = [nibble, "sft", "--out", str(out), "--task", config.task.name, "--seed", str(config.seed)]
    argv += ["--target-accuracy", str(config.model.sft_target_accuracy)]
    for key, value in config.task.options.items():
        argv += ["--task-option", f"{key}={value}"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return f"{' '.join(argv)}: no result in 1800 s"
    return None if result.returncode == 0 else f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}"
