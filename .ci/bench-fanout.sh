#!/usr/bin/env bash
# WebSocket fan-out and compression benchmark (docs/benchmarks.md): a 2,000-event burst to N
# WebSocket clients with and without permessage-deflate, and 5,000 idle clients' memory.
#   .ci/bench-fanout.sh [OTHER_WALGATE_BINARY ...]   (another binary, e.g. one built before a change,
#   is measured in the same run)
set -euo pipefail
cd "$(dirname "$0")/.."
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target walgate walgate-bench-fanout
build/proxy/walgate-bench-fanout build/proxy/walgate "$@"
