#!/usr/bin/env python3
"""Python stubs of agentloop's gRPC contracts, generated from proto/ when needed.

Nothing generated is committed. The first run of executor.py or client.py (or
`python3 examples/python/stubs.py [OUT_DIR]`) runs grpcio-tools' protoc over
proto/agentloop/v1/*.proto and proto/google/api/*.proto into OUT_DIR (default:
examples/python/build/stubs), and runs it again whenever a .proto file is newer than
the stubs. Copy this file as it is:
it only needs grpcio-tools and the path to your checkout's proto/ directory.
"""

import importlib.resources
import os
import pathlib
import shutil
import sys
import tempfile
import types

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
DEFAULT_OUT = HERE / "build" / "stubs"
# Written last into a finished generation; its age is the stubs' age.
STAMP = ".generated"


def generate(out_dir=DEFAULT_OUT):
    """Generates the stubs into out_dir unless they are newer than every .proto file;
    returns out_dir."""
    out_dir = pathlib.Path(out_dir).resolve()
    # The contracts, and the google.api.http option orchestrator.proto's routes use.
    protos = sorted(PROTO_ROOT.glob("agentloop/v1/*.proto")) + sorted(
        PROTO_ROOT.glob("google/api/*.proto")
    )
    if not protos:
        raise SystemExit(f"stubs: no .proto files under {PROTO_ROOT}")
    stamp = out_dir / STAMP
    newest = max(p.stat().st_mtime for p in protos)
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return out_dir

    from grpc_tools import protoc  # only needed to generate

    # Generate into a fresh directory beside out_dir, then move it into place, so a
    # reader never sees half a generation.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".stubs-", dir=out_dir.parent))
    # grpcio-tools ships google/protobuf/*.proto (duration, timestamp) in grpc_tools/_proto.
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    code = protoc.main([
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={tmp}",
        f"--grpc_python_out={tmp}",
        *map(str, protos),
    ])
    if code != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(f"stubs: protoc failed ({code}) on {PROTO_ROOT}")
    (tmp / STAMP).touch()
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        # Another process generated the same stubs at the same time; keep theirs.
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def load(out_dir=None):
    """Generates the stubs if needed and imports them: the messages by .proto file
    (common, tool_executor, orchestrator) and the service classes (*_grpc)."""
    out = generate(out_dir or DEFAULT_OUT)
    sys.path.insert(0, str(out))
    from agentloop.v1 import (  # noqa: E402 (generated above)
        common_pb2,
        orchestrator_pb2,
        orchestrator_pb2_grpc,
        tool_executor_pb2,
        tool_executor_pb2_grpc,
    )

    return types.SimpleNamespace(
        common=common_pb2,
        tool_executor=tool_executor_pb2,
        tool_executor_grpc=tool_executor_pb2_grpc,
        orchestrator=orchestrator_pb2,
        orchestrator_grpc=orchestrator_pb2_grpc,
    )


if __name__ == "__main__":
    print(generate(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUT))
