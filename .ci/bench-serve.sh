#!/usr/bin/env bash
# Serving benchmarks (docs/benchmarks.md): drain vs pg_recvlogical on the standard workload,
# commit-to-client latency with 100 WebSocket clients at 2,000 changes/s, and RSS per idle
# WebSocket client (5,000 of them).   .ci/bench-serve.sh [SHARED_BENCH_DIR]   (env ROWS)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-../shared/bench}
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target walgate walgate-bench-serve
build/proxy/walgate-bench-serve build/proxy/walgate "$bench"
