#!/usr/bin/env bash
# The one place generated protobuf/gRPC Python code comes from.
# protos/podium/v1/*.proto  ->  podium/v1/*_pb2.py, *_pb2_grpc.py, *.pyi
# Uses the protoc bundled in grpcio-tools (no system protoc needed) and mypy-protobuf for stubs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"
rm -f podium/v1/*_pb2*.py podium/v1/*_pb2*.pyi
mkdir -p podium/v1
"$PY" -m grpc_tools.protoc -Iprotos \
  --python_out=. --grpc_python_out=. \
  --plugin=protoc-gen-mypy="$(dirname "$(command -v "$PY")")/protoc-gen-mypy" --mypy_out=. \
  protos/podium/v1/*.proto
cat > podium/v1/__init__.py <<'PY'
"""Generated protobuf and gRPC code for podium.v1. Do not edit: run scripts/gen_protos.sh."""
PY
echo "generated $(ls podium/v1/*_pb2*.py | wc -l) modules into podium/v1/" >&2
