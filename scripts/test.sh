#!/usr/bin/env bash
# Set up (if needed) and run everything CI runs: lint, type check, the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check otel_numa tests benchmarks config scripts
.venv/bin/ruff format --check otel_numa tests benchmarks config scripts
.venv/bin/mypy
# the import-layer contracts of pyproject.toml; the report (a banner) is shown only when one is broken
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
exec .venv/bin/pytest "$@"
