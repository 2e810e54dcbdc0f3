#!/usr/bin/env bash
# Sets everything up and runs `walgate demo`: a throwaway PostgreSQL with a trickle of changes,
# streamed through walgate. Ctrl-C stops everything and leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
WALGATE_WITH_FUZZ=0 WALGATE_WITH_BROWSER=0 .ci/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target walgate
exec build/proxy/walgate demo "$@"
