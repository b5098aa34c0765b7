#!/usr/bin/env bash
# Regenerate the committed protobuf modules from proto/*.proto.
# Needs grpcio-tools (bundles protoc); the generated code pins the protobuf runtime range in pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc --version
for p in proto/*.proto; do
  python -m grpc_tools.protoc -Iproto --python_out=recordtool/format "$p"
done
ls -l recordtool/format/*_pb2.py
