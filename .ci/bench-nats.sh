#!/usr/bin/env bash
# Scale-out benchmark (docs/benchmarks.md, *Scale-out*): the JetStream origin's publish rate on the
# standard workload, to one nats-server (R1) and a 3-node cluster (R3), against pg_recvlogical's
# drain of the same WAL in the same run.   .ci/bench-nats.sh [SHARED_BENCH_DIR]   (env WALGATE_BENCH_ROUNDS)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-../shared/bench}
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target walgate walgate-bench-nats
build/proxy/walgate-bench-nats build/proxy/walgate "$bench"
