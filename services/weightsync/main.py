"""Weight-sync's entry point: parse and validate the config, then start the servers (and torch).

Once serving it prints one machine-readable line to stdout,
``READY publish_port=<p> port=<p> metrics_port=<p>``, with the bound ports (so a launcher can pass
port 0), and runs until SIGTERM or SIGINT, then shuts down gracefully and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from nibble.config import load

log = logging.getLogger("nibble.weightsync")


def main(argv: list[str] | None = None) -> int:
    """Run the service; returns the exit status (2 for a bad config or an unbindable port)."""
    parser = argparse.ArgumentParser(prog="nibble weightsync", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None, help="run configuration (YAML); defaults otherwise")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load(args.config).weightsync
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    import torch  # loads here, after the config is known good

    from nibble.weightsync.server import WeightSyncServer

    torch.set_num_threads(config.threads)
    try:
        server = WeightSyncServer(config)
        server.start()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"READY publish_port={server.publish_port} port={server.port} metrics_port={server.metrics_port}", flush=True)
    log.info("serving; store %s, keeping %d versions", config.store_dir, config.keep_versions)
    while not stop.wait(0.2):  # a bounded wait: the signal may land on a gRPC thread, which wakes no one
        pass
    log.info("shutting down")
    server.stop()
    return 0
