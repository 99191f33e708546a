"""The committed gRPC/protobuf stubs are what the pinned generator makes of the committed .proto."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("nibble_pb2.py", "nibble_pb2.pyi", "nibble_pb2_grpc.py")


def test_stubs_are_fresh(tmp_path):
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            "proto",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            "proto/nibble/wire/nibble.proto",
        ],
        cwd=tmp_path,
        check=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "nibble" / "wire" / name).read_text()
        committed = (ROOT / "nibble" / "wire" / name).read_text()
        assert fresh == committed, f"nibble/wire/{name} is stale: run scripts/gen_proto"


def test_stubs_require_no_newer_runtime_than_the_gpu_machine():
    # grpcio 1.84 and protobuf 7.36 are what the H200 machine has (docs/design.md §5).
    grpc_stub = (ROOT / "nibble" / "wire" / "nibble_pb2_grpc.py").read_text()
    assert "GRPC_GENERATED_VERSION = '1.84.0'" in grpc_stub
    pb_stub = (ROOT / "nibble" / "wire" / "nibble_pb2.py").read_text()
    assert "PUBLIC,\n    7,\n    35," in pb_stub


def test_round_trip_of_a_trajectory_group():
    from nibble.wire import pb

    group = pb.TrajectoryGroup(group_id="g", policy_version=3, prompt_tokens=[1, 2])
    group.responses.add(trajectory_id="s0-1", tokens=[5, 2], logprobs=[-0.5, -0.1], reward=1.0, finish_reason=pb.STOP)
    again = pb.TrajectoryGroup.FromString(group.SerializeToString())
    assert again == group and again.responses[0].finish_reason == pb.STOP
