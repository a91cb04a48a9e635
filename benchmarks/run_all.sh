#!/usr/bin/env bash
# Run every benchmark (about 5 minutes on 2 cores, loopback only) and keep the output.
# Usage: bash benchmarks/run_all.sh [OUTPUT_DIR]   (default: benchmarks/out, git-ignored)
# Needs the test extras (.venv from scripts/setup.sh --test, for rotel) and Debian's prometheus-node-exporter.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/out}"
mkdir -p "$out"
python=".venv/bin/python"
timeout 300 "$python" -m benchmarks.bench_scrape --json "$out/scrape.json" | tee "$out/scrape.md"
timeout 480 "$python" -m benchmarks.bench_agent --json "$out/agent.json" | tee "$out/agent.md"
