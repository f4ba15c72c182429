#!/usr/bin/env bash
# Benchmark (not a test): several hosts on one Postgres ledger. Each "host" is a network
# namespace with its own address, reaching Postgres over a veth link and a bridge, with its
# own spool directory and spool node; the source, staging and destination directories are
# shared (a NAS). For each host count in HOSTS:
#   ledger    one `ledger-bench --phase work --workers WORKERS --batch BATCH` per host on
#             TASKS seeded tasks: claim + complete cycles per second, all hosts together
#   pipeline  all four stages as --watch services on every host, FILES x RECORDS generated
#             events (Avro, null codec): wall time from start to the last chunk published,
#             records/s, attempts that did not finish (redone work), chunks done twice, and how
#             busy the machine's cores were meanwhile
# It prints one markdown table per part.
#   bench/scaleout.sh [DIR] [FILES] [RECORDS_PER_FILE]
#   env: HOSTS="1 2 4", TASKS=20000, WORKERS=8, BATCH=16 (claims per ledger-bench worker)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
. scripts/netns.sh
DIR=${1:-/tmp/ferry-scaleout}; FILES=${2:-8}; RECORDS=${3:-100000}
HOSTS=${HOSTS:-"1 2 4"}; TASKS=${TASKS:-20000}; WORKERS=${WORKERS:-8}; BATCH=${BATCH:-16}
N=$((FILES * RECORDS))
max=0; for h in $HOSTS; do [ "$h" -gt "$max" ] && max=$h; done
ferry_release_bins -p ferry-bench -p ferry-tests
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ferry_stop_postgres
  ferry_netns_down
}
trap cleanup EXIT
ferry_netns_up "$max"
FERRY_PG_ALSO="$FERRY_NET_GW $FERRY_NET_SUBNET" ferry_start_postgres
PSQL=("$(ferry_pg_bin)/psql" -X -A -t -q -v ON_ERROR_STOP=1)
pg_url() { echo "postgres://postgres@$FERRY_NET_GW:$FERRY_PG_PORT/$1"; }
fresh_db() { "${PSQL[@]}" "$FERRY_TEST_POSTGRES" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1" 2>/dev/null; }
busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }
hosts() { echo "$FERRY_NET_HOSTS" | tr ' ' '\n' | grep . | head -"$1"; }
now() { date +%s.%N; }

rm -rf "$DIR" && mkdir -p "$DIR"
"$BIN/ferry" gen --format avro --codec null --out "$DIR/in" --files "$FILES" --records "$RECORDS" --block-records 4000 >/dev/null
echo "input: $N events, $(du -sb "$DIR/in" | cut -f1) bytes of Avro; $(nproc) cores; hosts: $HOSTS"

echo
echo "| hosts | ledger workers (claim batch $BATCH) | claim+complete cycles/s |"
echo "|---|---|---|"
for h in $HOSTS; do
  db=ledger_$h; fresh_db "$db"
  "$BIN/ledger-bench" --ledger "$(pg_url "$db")" --phase seed --tasks "$TASKS" >/dev/null
  t0=$(now); PIDS=()
  for host in $(hosts "$h"); do
    ip netns exec "$host" "$BIN/ledger-bench" --ledger "$(pg_url "$db")" --phase work --workers "$WORKERS" --batch "$BATCH" > "$DIR/ledger.$h.$host" &
    PIDS+=($!)
  done
  for p in "${PIDS[@]}"; do wait "$p"; done; PIDS=()
  secs=$(echo "$(now) - $t0" | bc -l)
  cycles=$(sed -n 's/.* cycles=\([0-9]*\) .*/\1/p' "$DIR"/ledger."$h".* | paste -sd+ | bc)
  [ "$cycles" -eq "$TASKS" ] || { echo "ledger: $cycles cycles for $TASKS tasks" >&2; exit 1; }
  printf '| %d | %d | %.0f |\n' "$h" $((h * WORKERS)) "$(echo "$cycles / $secs" | bc -l)"
done

echo
echo "| hosts | stage processes | wall | records/s | cores busy | attempts redone | chunks done twice |"
echo "|---|---|---|---|---|---|---|"
for h in $HOSTS; do
  run=$DIR/run$h; db=pipeline_$h; rm -rf "$run"; mkdir -p "$run"; fresh_db "$db"
  sed -e "s#sqlite://ferry-ledger.db#$(pg_url "$db")#" -e "s#\"/data/incoming\"#\"$DIR/in\"#" \
      -e "s#\"/data/staging\"#\"$run/staging\"#" -e "s#\"/var/spool/ferry\"#\"$run/spool\"#" \
      -e "s#\"/data/warehouse\"#\"$run/warehouse\"#" -e 's#settle = "10s"#settle = "0s"#' \
      deploy/ferry.example.toml > "$run/ferry.toml"
  export FERRY_CONFIG=$run/ferry.toml
  "$BIN/ferry" migrate >/dev/null
  t0=$(now); read -r b0 a0 < <(busy); PIDS=()
  for host in $(hosts "$h"); do
    for stage in extract transform copy load; do
      ip netns exec "$host" env FERRY_SPOOL_DIR="$run/spool-$host" FERRY_SPOOL_NODE="$host" \
        "$BIN/ferry-$stage" --watch --poll 200ms > "$run/log.$host.$stage" 2>&1 &
      PIDS+=($!)
    done
  done
  q() { "${PSQL[@]}" "$(pg_url "$db")" -c "$1"; }
  until [ "$(q "SELECT COUNT(*) FROM source_files WHERE state <> 'registered'")" = "$FILES" ] \
     && [ "$(q "SELECT COUNT(*) FROM tasks WHERE state <> 'done'")" = 0 ] \
     && [ "$(q "SELECT COUNT(*) FROM tasks WHERE stage = 'load'")" = "$(q "SELECT COUNT(*) FROM chunks")" ]; do
    if [ "$(echo "$(now) - $t0 > 900" | bc)" = 1 ]; then
      echo "pipeline with $h host(s): not published within 15 minutes; logs in $run" >&2
      q "SELECT stage, state, COUNT(*) FROM tasks GROUP BY stage, state" >&2
      exit 1
    fi
    sleep 0.2
  done
  secs=$(echo "$(now) - $t0" | bc -l); read -r b1 a1 < <(busy)
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait "${PIDS[@]}" || true; PIDS=()
  rows=$(q "SELECT SUM(records) FROM published")
  [ "$rows" = "$N" ] || { echo "pipeline: $rows rows published for $N events" >&2; exit 1; }
  redone=$(q "SELECT COUNT(*) FROM attempts WHERE outcome <> 'done'")
  twice=$(q "SELECT COUNT(*) FROM (SELECT task_id FROM attempts WHERE outcome = 'done' GROUP BY task_id HAVING COUNT(*) > 1) d")
  printf '| %d | %d | %.2f s | %.0f | %.0f%% | %s | %s |\n' "$h" $((h * 4)) "$secs" "$(echo "$N / $secs" | bc -l)" \
    "$(echo "100 * ($b1 - $b0) / ($a1 - $a0)" | bc -l)" "$redone" "$twice"
done
