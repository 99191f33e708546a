"""Generated protobuf/gRPC stubs of ``proto/nibble/wire/nibble.proto`` — the only place they live.

Regenerate with ``scripts/gen_proto``; ``tests/proto/test_stubs.py`` fails when they are stale.
"""

from nibble.wire import nibble_pb2 as pb
from nibble.wire import nibble_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
