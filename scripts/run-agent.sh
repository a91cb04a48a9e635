#!/usr/bin/env bash
# Set up (if needed) and run the agent against this machine. Extra arguments go to otel-numa,
# e.g. `scripts/run-agent.sh --once` prints one Prometheus exposition and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/otel-numa "$@"
