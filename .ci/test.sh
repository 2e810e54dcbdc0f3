#!/usr/bin/env bash
# Sets everything up and runs every test: installs what is missing, builds with gcc, runs the
# unit tests, the fuzz corpus replays and the integration suite against PostgreSQL 13 to 18 (15
# from Debian, the others from npm), then runs each fuzz target under libFuzzer + ASan + UBSan for
# a bounded time.
#   WALGATE_PG_VERSIONS="15 18"   servers for the integration suite (default: 13 14 15 16 17 18)
#   WALGATE_FUZZ_SECONDS=15        libFuzzer time per target (0 skips the fuzz build)
set -euo pipefail
cd "$(dirname "$0")/.."

versions=${WALGATE_PG_VERSIONS:-13 14 15 16 17 18}
fuzz_seconds=${WALGATE_FUZZ_SECONDS:-15}
[ "$fuzz_seconds" = 0 ] && export WALGATE_WITH_FUZZ=0

.ci/install-deps.sh
bindirs=""
for v in $versions; do
  b=$(.ci/install-pg.sh "$v")
  bindirs="${bindirs:+$bindirs;}$b"
done

# playwright-core drives Debian's chromium (it never downloads a browser of its own).
(cd tests/browser && npm install --no-audit --no-fund --loglevel=error >/dev/null)

cmake --preset default -DWALGATE_PG_BINDIRS="$bindirs" >/dev/null
cmake --build --preset default

if [ "$fuzz_seconds" != 0 ]; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz
  .ci/fuzz.sh "$fuzz_seconds"
fi

# Last, so that its summary closes the output.
ctest --preset default
