#!/usr/bin/env bash
# Snapshot benchmarks (docs/benchmarks.md): on 1,000,000 rows of the standard workload's shape,
# psql's \copy to /dev/null, walgate's initial snapshot into its event log, and a per-client
# snapshot to an NDJSON client.   .ci/bench-snapshot.sh [SHARED_BENCH_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-../shared/bench}
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target walgate walgate-bench-snapshot
build/proxy/walgate-bench-snapshot build/proxy/walgate "$bench"
