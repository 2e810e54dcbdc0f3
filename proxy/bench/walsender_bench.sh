#!/bin/bash
# Issue 35's benchmark: the standard workload (../shared/bench) drained by N pg_recvlogical
# (wal2json) — N slots on PostgreSQL directly against N downstream slots on walgate — for each N
# given (default 1 10 50), side by side in one run. Prints one table row per N and side: drain
# wall time, the primary's walsenders' CPU, walgate's CPU and peak RSS.
#
#   proxy/bench/walsender_bench.sh BUILD_DIR [N...]      (env ROWS: the workload's rows, 200000;
#                                                          OPTIONS: pg_recvlogical -o flags for
#                                                          both sides, e.g. "-o format-version=2")
#
# Needs Debian's postgresql-15 and postgresql-15-wal2json (.ci/install-deps.sh). Everything runs
# in a temporary directory, removed at the end.
#
# How each side is measured:
# - direct: N wal2json slots made before the load; after it, N `pg_recvlogical --endpos=END`
#   started at once, timed until the last exits. The walsenders' CPU is what the postmaster's
#   reaped children used meanwhile (cutime + cstime in /proc/PID/stat: the walsenders exit with
#   their clients);
# - walgate: N downstream slots made before the load on walgate's --replication-listen; walgate
#   streams the load from its one upstream slot as it happens; after it, N `pg_recvlogical
#   --endpos=END` against walgate, timed until the last exits. The primary's CPU is walgate's
#   walsender's (one process, from before the load to the drain's end: decoding the load once);
#   walgate's CPU over the same span, its peak RSS (VmHWM) at the end.
set -euo pipefail
BUILD=${1:?usage: walsender_bench.sh BUILD_DIR [N...]}
shift
NS=("$@")
[ ${#NS[@]} -eq 0 ] && NS=(1 10 50)
BUILD=$(cd "$BUILD" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=$(cd "$HERE/../../../shared/bench" && pwd)
PGBIN=/usr/lib/postgresql/15/bin
RECV=$PGBIN/pg_recvlogical
WALGATE=$BUILD/proxy/walgate
TICK=$(getconf CLK_TCK)
DIR=$(mktemp -d /tmp/walsender-bench-XXXXXX)
PGPORT=$((20000 + RANDOM % 10000))
HTTP=$((PGPORT + 1))
REPL=$((PGPORT + 2))
cleanup() {
  [ -n "${WG:-}" ] && kill "$WG" 2>/dev/null && wait "$WG" 2>/dev/null || true
  "${AS[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT

AS=()   # (as root: the server runs as the postgres user, as the tests' clusters do)
if [ "$(id -u)" = 0 ]; then
  AS=(runuser -u postgres --)
  chown postgres "$DIR"
fi
"${AS[@]}" "$PGBIN/initdb" -D "$DIR/pg" -U postgres -A trust >/dev/null
"${AS[@]}" tee -a "$DIR/pg/postgresql.conf" >/dev/null <<EOF
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DIR'
wal_level = logical
max_replication_slots = 200
max_wal_senders = 200
max_connections = 300
timezone = 'UTC'
EOF
"${AS[@]}" "$PGBIN/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w start >/dev/null
UP="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres"
DOWN="host=127.0.0.1 port=$REPL user=postgres dbname=postgres sslmode=disable"
psql() { /usr/bin/psql -X -q -At "$UP" "$@"; }
psql -f "$SHARED/workload.sql" >/dev/null 2>&1
psql -c "CREATE PUBLICATION bench_pub FOR TABLE bench_orders"

"$WALGATE" --pg "$UP" --slot walgate_bench --publication bench_pub --data-dir "$DIR/data" \
  --listen 127.0.0.1:$HTTP --replication-listen 127.0.0.1:$REPL >"$DIR/walgate.log" 2>&1 &
WG=$!
for _ in $(seq 1 300); do grep -q "streaming from PostgreSQL at" "$DIR/walgate.log" && break; sleep 0.1; done
grep -q "streaming from PostgreSQL at" "$DIR/walgate.log" || { cat "$DIR/walgate.log"; exit 1; }

cpu_of() { awk -v t="$TICK" '{ sub(/.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
children_cpu_of() { awk -v t="$TICK" '{ sub(/.*\) /, ""); print ($14 + $15) / t }' "/proc/$1/stat"; }
now() { date +%s.%N; }
POSTMASTER=$(head -1 "$DIR/pg/postmaster.pid")

echo "| N | side | drain wall time | primary's walsenders' CPU | walgate's CPU | walgate's peak RSS |"
echo "|---|---|---|---|---|---|"
for N in "${NS[@]}"; do
  psql -c "TRUNCATE bench_orders" -c "SELECT setval('bench_orders_id_seq', 1, false)" >/dev/null
  for i in $(seq 1 "$N"); do
    "$RECV" -d "$UP" --slot "direct_${N}_$i" --plugin wal2json --create-slot
    "$RECV" -d "$DOWN" --slot "down_${N}_$i" --plugin wal2json --create-slot
  done
  WS_PID=$(psql -c "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'walgate_bench'")
  ws_cpu0=$(cpu_of "$WS_PID")
  wg_cpu0=$(cpu_of "$WG")
  ROWS=${ROWS:-200000} "$SHARED/load.sh" "$UP" >/dev/null
  END=$(psql -c "SELECT pg_current_wal_lsn()")

  # Direct: N walsenders, each decoding the load.
  pm0=$(children_cpu_of "$POSTMASTER")
  t0=$(now)
  pids=()
  for i in $(seq 1 "$N"); do
    # shellcheck disable=SC2086
    "$RECV" -d "$UP" --slot "direct_${N}_$i" --start --endpos="$END" --no-loop -F 0 ${OPTIONS:-} -f - >/dev/null 2>>"$DIR/recv.log" &
    pids+=($!)
  done
  wait "${pids[@]}"
  t1=$(now)
  sleep 0.5   # (the walsenders exit and are reaped)
  pm1=$(children_cpu_of "$POSTMASTER")
  printf "| %d | PostgreSQL, %d slots | %.2f s | %.2f s | | |\n" "$N" "$N" "$(echo "$t1 - $t0" | bc)" "$(echo "$pm1 - $pm0" | bc)"

  # walgate: one walsender decoded the load; N downstream slots.
  t0=$(now)
  pids=()
  for i in $(seq 1 "$N"); do
    # shellcheck disable=SC2086
    "$RECV" -d "$DOWN" --slot "down_${N}_$i" --start --endpos="$END" --no-loop -F 0 ${OPTIONS:-} -f - >/dev/null 2>>"$DIR/recv.log" &
    pids+=($!)
    [ $((i % 8)) -eq 0 ] && sleep 0.05   # (walgate admits 16 connections of one address in their startup at once)
  done
  wait "${pids[@]}"
  t1=$(now)
  ws_cpu1=$(cpu_of "$WS_PID")
  wg_cpu1=$(cpu_of "$WG")
  rss=$(awk '/VmHWM/ { print $2 / 1024 }' "/proc/$WG/status")
  printf "| %d | walgate, %d downstream slots | %.2f s | %.2f s | %.2f s | %.0f MiB |\n" "$N" "$N" \
    "$(echo "$t1 - $t0" | bc)" "$(echo "$ws_cpu1 - $ws_cpu0" | bc)" "$(echo "$wg_cpu1 - $wg_cpu0" | bc)" "$rss"

  for i in $(seq 1 "$N"); do
    "$RECV" -d "$UP" --slot "direct_${N}_$i" --drop-slot
    "$RECV" -d "$DOWN" --slot "down_${N}_$i" --drop-slot
  done
done
