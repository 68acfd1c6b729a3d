#!/usr/bin/env bash
# The one place generated protobuf/gRPC Python code comes from.
# protos/podium/v1/*.proto  ->  podium/v1/*_pb2.py, *_pb2_grpc.py, *.pyi
# Uses the protoc bundled in grpcio-tools (no system protoc needed) and mypy-protobuf for stubs.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
cd "$ROOT"
# Generate into a scratch directory and swap only when protoc succeeded: a failing protoc (the
# wrong python, a syntax error in a .proto) must leave the committed modules in place.
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$PY" -m grpc_tools.protoc -Iprotos \
  --python_out="$OUT" --grpc_python_out="$OUT" \
  --plugin=protoc-gen-mypy="$(dirname "$(command -v "$PY")")/protoc-gen-mypy" --mypy_out="$OUT" \
  protos/podium/v1/*.proto
count="$(ls "$OUT"/podium/v1/*_pb2*.py 2>/dev/null | wc -l)"
if [ "$count" -eq 0 ]; then
  echo "gen_protos: protoc wrote no modules; podium/v1 left as it was" >&2
  exit 1
fi
mkdir -p podium/v1
rm -f podium/v1/*_pb2*.py podium/v1/*_pb2*.pyi
cp "$OUT"/podium/v1/*_pb2* podium/v1/
cat > podium/v1/__init__.py <<'PY'
"""Generated protobuf and gRPC code for podium.v1. Do not edit: run scripts/gen_protos.sh."""
PY
echo "generated $count modules into podium/v1/" >&2
