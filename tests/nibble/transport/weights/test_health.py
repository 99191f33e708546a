"""gRPC health checking of the trainer and samplers, asked by `nibble health` (the images' HEALTHCHECK)."""

import subprocess
import sys
from pathlib import Path

from nibble.launcher import free_port
from nibble.transport.weights.health import HealthServer, start_health

NIBBLE = str(Path(sys.executable).with_name("nibble"))


def ask(address: str) -> subprocess.CompletedProcess:
    return subprocess.run([NIBBLE, "health", address, "--timeout", "2"], capture_output=True, text=True, timeout=60)


def test_not_serving_until_ready_then_serving_then_gone():
    assert start_health("127.0.0.1", None) is None
    server = start_health("127.0.0.1", free_port())
    address = f"127.0.0.1:{server.port}"
    starting = ask(address)
    assert starting.returncode == 1 and "NOT_SERVING" in starting.stdout
    server.serving()
    ready = ask(address)
    assert ready.returncode == 0 and ready.stdout.strip() == f"{address}: SERVING"
    server.stop()
    gone = ask(address)
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr


def test_a_taken_port_is_refused_by_name():
    first = HealthServer("127.0.0.1", free_port()).start()
    try:
        HealthServer("127.0.0.1", first.port).start()
    except ValueError as exc:
        assert f"127.0.0.1:{first.port}" in str(exc)
    else:
        raise AssertionError("binding a taken port succeeded")
    finally:
        first.stop()
