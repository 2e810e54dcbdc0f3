#!/usr/bin/env bash
# Decode benchmark (docs/benchmarks.md): captures the standard workload from a throwaway
# PostgreSQL 15 through walgate's replication client, then decodes the capture on one core.
#   .ci/bench-decode.sh [SHARED_BENCH_DIR]     (default ../shared/bench; env ROWS, PASSES)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-../shared/bench}
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target decode_bench walgate-capture-workload
frames=$(mktemp /tmp/walgate-bench-XXXXXX.frames)
trap 'rm -f "$frames"' EXIT
build/proxy/walgate-capture-workload "$frames" "$bench"
build/protocol/decode_bench "$frames" "${PASSES:-20}" 1
