#!/usr/bin/env bash
# Regenerate the Python protobuf/gRPC modules and their type stubs from otel_numa/proto/*.proto.
#
# Usage: scripts/gen_protos.sh [--without-stubs] [OUTPUT_ROOT]
#   OUTPUT_ROOT defaults to the repository root; files land in OUTPUT_ROOT/otel_numa/proto/.
#   PYTHON selects the interpreter (default: .venv/bin/python, else python3); it needs grpcio-tools.
#   The .pyi stubs need mypy-protobuf's plugins (protoc-gen-mypy, protoc-gen-mypy_grpc), looked up
#   next to PYTHON, then on PATH; --without-stubs writes only the *_pb2.py and *_pb2_grpc.py modules.
#
# The output depends only on the .proto files and the versions of grpcio-tools and mypy-protobuf,
# so running it twice gives byte-identical files (tests/unit/test_protos.py checks this).
set -euo pipefail

with_stubs=1
if [[ "${1:-}" == "--without-stubs" ]]; then
    with_stubs=0
    shift
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
output_root="${1:-$repo_root}"
output_root="$(mkdir -p "$output_root" && cd "$output_root" && pwd)"

if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then
        PYTHON="$repo_root/.venv/bin/python"
    else
        PYTHON="python3"
    fi
fi

find_plugin() {
    local name="$1" candidate
    candidate="$(dirname "$(command -v "$PYTHON")")/$name"
    if [[ -x "$candidate" ]]; then
        echo "$candidate"
    elif command -v "$name" >/dev/null; then
        command -v "$name"
    else
        echo "gen_protos.sh: $name not found (pip install mypy-protobuf, or use --without-stubs)" >&2
        return 1
    fi
}
stub_args=()
if ((with_stubs)); then
    stub_args=(
        --plugin=protoc-gen-mypy="$(find_plugin protoc-gen-mypy)"
        --plugin=protoc-gen-mypy_grpc="$(find_plugin protoc-gen-mypy_grpc)"
        --mypy_out="$output_root"
        --mypy_grpc_out="$output_root"
    )
fi

mkdir -p "$output_root/otel_numa/proto"
# Proto paths relative to the repository root make the generated imports package-qualified
# (from otel_numa.proto import ...) and keep absolute paths out of the output.
cd "$repo_root"
for proto in otel_numa/proto/*.proto; do
    "$PYTHON" -m grpc_tools.protoc \
        --proto_path=. \
        --python_out="$output_root" \
        --grpc_python_out="$output_root" \
        "${stub_args[@]}" \
        "$proto"
done
