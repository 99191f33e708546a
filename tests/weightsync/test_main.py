"""The service as a process: ``python -m nibble.weightsync --config FILE`` and ``nibble weightsync``."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def test_the_service_reports_its_ports_and_exits_0_promptly_on_sigterm(tmp_path):
    config = tmp_path / "run.yaml"
    settings = {"port": 0, "publish_port": 0, "metrics_port": 0, "store_dir": str(tmp_path / "store")}
    config.write_text(yaml.safe_dump({"weightsync": settings}))
    process = subprocess.Popen(
        [sys.executable, "-m", "nibble.weightsync", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NIBBLE_PUBLISH_TOKEN": "s3cret-publish"},
    )
    try:
        ready = process.stdout.readline().split()
        assert ready[0] == "READY", process.stderr.read()
        ports = dict(field.split("=") for field in ready[1:])
        assert set(ports) == {"publish_port", "port", "metrics_port"} and all(int(p) > 0 for p in ports.values())
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - started < 10
        log = process.stderr.read()
        assert "no fetch token configured" in log and "no publish token" not in log
        assert "s3cret-publish" not in log + " ".join(ready)
    finally:
        process.kill()


def test_a_bad_config_fails_before_serving_naming_the_key(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"weightsync": {"keep_version": 2}}))
    result = subprocess.run([NIBBLE, "weightsync", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "weightsync.keep_version" in result.stderr
