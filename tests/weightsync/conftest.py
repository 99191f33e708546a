"""Weight-sync test fixtures: real servers on loopback (port 0), clients with tokens, a tiny trainer model."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable
from pathlib import Path

import grpc
import pytest
import torch

from nibble.config import WeightSyncConfig
from nibble.launcher import free_port
from nibble.model import MoETransformer, tiny
from nibble.recipe import PrecisionPlan
from nibble.recipe.export import published_state
from nibble.transport.weights import GrpcWeightPublisher, GrpcWeightSubscriber
from nibble.weightsync.server import WeightSyncServer
from nibble.wire import pb
from tests.helpers import raw_publish

PUBLISH_TOKEN, FETCH_TOKEN = "publish-secret", "fetch-secret"
TOKENS = {"NIBBLE_PUBLISH_TOKEN": PUBLISH_TOKEN, "NIBBLE_FETCH_TOKEN": FETCH_TOKEN}


class Harness:
    """Starts servers on one store directory and hands out clients; stops everything afterwards."""

    def __init__(self, store_dir: Path):
        self.store_dir = store_dir
        self.servers: list[WeightSyncServer] = []
        self.clients: list = []

    def start(self, **config) -> WeightSyncServer:
        # ports drawn outside the ephemeral range: a test that restarts a server on its port needs it still free
        ports = {"port": free_port(), "publish_port": free_port()}
        settings = {**ports, "store_dir": self.store_dir, "chunk_bytes": 64 * 1024, **config}
        server = WeightSyncServer(WeightSyncConfig(**settings), environ=TOKENS)
        server.start()
        self.servers.append(server)
        return server

    def publisher(self, server: WeightSyncServer, token: str | None = PUBLISH_TOKEN) -> GrpcWeightPublisher:
        client = GrpcWeightPublisher(f"127.0.0.1:{server.publish_port}", token, chunk_bytes=16 * 1024, attempts=1)
        self.clients.append(client)
        return client

    def subscriber(self, server: WeightSyncServer, token: str | None = FETCH_TOKEN, **kwargs) -> GrpcWeightSubscriber:
        client = GrpcWeightSubscriber(f"127.0.0.1:{server.port}", token, **kwargs)
        self.clients.append(client)
        return client

    def watch(self, subscriber: GrpcWeightSubscriber, after: int = 0) -> queue.Queue:
        """Versions announced to ``subscriber``, collected by a background thread."""
        seen: queue.Queue = queue.Queue()

        def run():
            try:
                for announcement in subscriber.watch(after):
                    seen.put(announcement.policy_version)
            except grpc.RpcError as exc:
                seen.put(exc)

        threading.Thread(target=run, daemon=True).start()
        return seen

    def raw_publish(self, server: WeightSyncServer, items: Iterable[pb.WeightStreamItem], token=PUBLISH_TOKEN):
        """Send hand-made stream items (to corrupt them); returns the reply or raises grpc.RpcError."""
        return raw_publish(f"127.0.0.1:{server.publish_port}", items, token)

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for server in self.servers:
            server.stop(0)


@pytest.fixture
def harness(tmp_path):
    harness = Harness(tmp_path / "store")
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def trainer() -> tuple[MoETransformer, PrecisionPlan]:
    torch.manual_seed(0)
    config = tiny(vocab_size=32)
    plan = PrecisionPlan(num_layers=config.num_hidden_layers)
    return MoETransformer(config, plan), plan


@pytest.fixture(scope="module")
def state(trainer) -> dict[str, torch.Tensor]:
    return published_state(trainer[0])
