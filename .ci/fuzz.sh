#!/usr/bin/env bash
# Runs every libFuzzer target (built by `cmake --preset fuzz && cmake --build --preset fuzz`)
# for SECONDS each, starting from its seed corpus, with its dictionary. New inputs go to a
# scratch directory, so the committed corpus only changes on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
failed=0
for bin in build-fuzz/fuzz/*_fuzzer; do
  name=$(basename "$bin" _fuzzer)
  work=$(mktemp -d)
  dict=()
  [ -f "fuzz/dict/$name.dict" ] && dict=(-dict="fuzz/dict/$name.dict")
  echo "fuzz: $name for ${seconds}s"
  if ! "$bin" -seed=1 -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=0 \
      "${dict[@]}" "$work" "fuzz/corpus/$name" >"$work/log" 2>&1; then
    echo "fuzz: $name FAILED"; tail -40 "$work/log"; failed=1
  else
    grep -E '^#[0-9]+.*DONE' "$work/log" | tail -1 || true
  fi
  rm -rf "$work"
done
exit $failed
