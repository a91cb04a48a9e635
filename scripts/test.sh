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
# The agent's modules compiled once, here: where PYTHONDONTWRITEBYTECODE is set (as on CI machines), every
# agent process the tests start (well over a hundred) would compile them again, ~0.15 s of CPU each.
.venv/bin/python -m compileall -q otel_numa benchmarks
# the tests wait on deadlines and peers more than they compute: one worker more than the cores (at most 8;
# with two more, the tests that time answers under attack fail on 2 cores); the container-engine tests share
# one worker (their xdist group, tests/conftest.py) so that no worker waits for another's turn. `-n 0` runs
# them all in this process.
workers=$(( $(nproc) + 1 ))
[ "$workers" -le 8 ] || workers=8
exec .venv/bin/pytest -n "$workers" --dist loadgroup "$@"
