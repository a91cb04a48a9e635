#!/usr/bin/env bash
# The cost benchmarks: the agent beside node_exporter on three trees (bench_cost), once on each export
# path (--fast-path auto, then off), about 12 minutes on 2 cores, loopback only. Tables are printed and
# written to benchmarks/out/ (git-ignored); the last one puts both paths side by side.
# Usage: bash benchmarks/run_all.sh [--quick] [--all] [bench_cost options, e.g. --trees 2x32]
#   --quick  a smoke run (3 scrapes and 2 cycles per tree)
#   --all    afterwards also the older scrape and largest-node benchmarks (about 8 minutes more)
# Needs the test extras (.venv from scripts/setup.sh --test, for rotel) and Debian's prometheus-node-exporter.
set -euo pipefail
cd "$(dirname "$0")/.."
python=".venv/bin/python"
out="benchmarks/out"
all=0
args=()
for arg in "$@"; do
    if [ "$arg" = "--all" ]; then all=1; else args+=("$arg"); fi
done
mkdir -p "$out"
OTEL_NUMA_FAST_PATH=auto timeout 900 "$python" -m benchmarks.bench_cost --out "$out" --name cost-fast "${args[@]}"
OTEL_NUMA_FAST_PATH=off timeout 900 "$python" -m benchmarks.bench_cost --out "$out" --name cost-public "${args[@]}"
"$python" -m benchmarks.compare_paths "$out/cost-fast.json" "$out/cost-public.json" | tee "$out/paths.md"
if [ $all -eq 1 ]; then
    timeout 300 "$python" -m benchmarks.bench_scrape --json "$out/scrape.json" | tee "$out/scrape.md"
    timeout 480 "$python" -m benchmarks.bench_agent --json "$out/agent.json" | tee "$out/agent.md"
fi
