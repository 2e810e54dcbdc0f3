#!/usr/bin/env bash
# Encode benchmark (docs/benchmarks.md): captures the standard workload, then encodes every change
# in each format on one core.   .ci/bench-encode.sh [SHARED_BENCH_DIR]   (env ROWS, PASSES)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-../shared/bench}
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target encode_bench walgate-capture-workload
frames=$(mktemp /tmp/walgate-bench-XXXXXX.frames)
trap 'rm -f "$frames"' EXIT
build/proxy/walgate-capture-workload "$frames" "$bench"
build/transform/encode_bench "$frames" "${PASSES:-5}"
