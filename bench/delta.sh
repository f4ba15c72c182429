#!/usr/bin/env bash
# Benchmark (not a test): load into a Delta table and into an Iceberg table (its catalog in the
# ledger) next to load into the Hive layout, on the same chunks. Extract and transform run once; then, ROUNDS times for each table format,
# alternating, the ledger and spool go back to what transform left, the table is emptied, copy
# lands the chunks and `ferry-load --once` is timed. Prints one markdown table (also written
# to bench/results/delta-<date>.md): load's wall and CPU time, records/s, chunks/s, the Delta
# log's commits (chunks ready together share one) and bytes per commit, the checkpoints
# written, and the Iceberg table's snapshots and metadata bytes. Then the last round's Delta table is compacted (`ferry compact`, timed) and, on a
# local dir, read whole by delta-rs before and after (median of 5 reads each).
#
#   bench/delta.sh [DIR]         (default /tmp/ferry-delta-bench)
#   env: FILES=8, RECORDS=60000 (per file), CHUNK=2MiB (extract.chunk_size: small chunks, as the
#        commits are what differs), ROUNDS=5, HDFS=1 (the table on a MiniDFS cluster,
#        staging local; every commit there pays HDFS's close wait), BIN (release binaries; built
#        when unset)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-delta-bench}
FILES=${FILES:-8}; RECORDS=${RECORDS:-60000}; CHUNK=${CHUNK:-2MiB}; ROUNDS=${ROUNDS:-5}; HDFS=${HDFS:-0}
if [ -z "${BIN:-}" ]; then ferry_release_bins; fi
rm -rf "$DIR" && mkdir -p "$DIR"
ferry_local_config "$DIR" avro "$CHUNK" > "$DIR/hive.toml"
WH=$DIR/warehouse
if [ "$HDFS" = 1 ]; then
  . scripts/minidfs.sh
  trap 'ferry_stop_minidfs 2>/dev/null || true' EXIT
  ferry_start_minidfs A
  WH=$FERRY_TEST_HDFS_A/warehouse
  sed -i -e "s#^url = \"$DIR/warehouse\"#url = \"$WH\"#" "$DIR/hive.toml"
  grep -q "^url = \"$WH\"" "$DIR/hive.toml" || { echo "delta bench: the table is not on HDFS" >&2; exit 1; }
fi
sed 's#^\[destination\].*#&\ntable_format = "delta"#' "$DIR/hive.toml" > "$DIR/delta.toml"
grep -q '^table_format = "delta"' "$DIR/delta.toml" || { echo "delta bench: no [destination] section to set" >&2; exit 1; }
sed 's#^table_format = "delta"#table_format = "iceberg"#' "$DIR/delta.toml" > "$DIR/iceberg.toml"
FORMATS="hive iceberg delta"  # Delta last: the compaction below works on its table
empty_table() {
  if [ "$HDFS" = 1 ]; then ferry_fsshell -fs "$FERRY_TEST_HDFS_A" -rm -r -f -skipTrash /warehouse >/dev/null 2>&1 || true
  else rm -rf "$DIR/warehouse"; fi
}
"$BIN/ferry" gen --format avro --codec deflate --out "$DIR/in" --files "$FILES" --records "$RECORDS" >/dev/null
export FERRY_CONFIG=$DIR/hive.toml
"$BIN/ferry-extract" --once >/dev/null 2>&1
"$BIN/ferry-transform" --once >/dev/null 2>&1
mkdir -p "$DIR/saved"
cp -a "$DIR/ledger.db"* "$DIR/spool" "$DIR/saved/"
chunks=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM chunks').fetchone()[0])" "$DIR/ledger.db")
records=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT SUM(records) FROM parts').fetchone()[0])" "$DIR/ledger.db")
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for r in $(seq "$ROUNDS"); do
  for fmt in $FORMATS; do
    rm -rf "$DIR/ledger.db"* "$DIR/spool"
    cp -a "$DIR/saved/." "$DIR/"
    empty_table
    export FERRY_CONFIG=$DIR/$fmt.toml
    "$BIN/ferry-copy" --once >/dev/null 2>"$DIR/copy.log" || { cat "$DIR/copy.log" >&2; exit 1; }
    /usr/bin/time -f "%e %U %S %M" -o "$DIR/t" "$BIN/ferry-load" --once >/dev/null 2>"$DIR/load.log" || { cat "$DIR/load.log" >&2; exit 1; }
    read -r wall user sys kib < "$DIR/t"
    echo "$wall $(echo "$user + $sys" | bc -l) $kib" >> "$DIR/$fmt.times"
    left=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(\"SELECT COUNT(*) FROM tasks WHERE state <> 'done'\").fetchone()[0])" "$DIR/ledger.db")
    [ "$left" = 0 ] || { echo "delta bench: $left tasks not done after load ($fmt)" >&2; exit 1; }
    if [ "$fmt" = delta ]; then
      if [ "$HDFS" = 1 ]; then
        rm -rf "$DIR/log" && ferry_fsshell -fs "$FERRY_TEST_HDFS_A" -get /warehouse/events/_delta_log "$DIR/log" >/dev/null 2>&1
      else
        rm -rf "$DIR/log" && cp -a "$DIR/warehouse/events/_delta_log" "$DIR/log"
      fi
    fi
    if [ "$fmt" = iceberg ]; then
      if [ "$HDFS" = 1 ]; then
        rm -rf "$DIR/meta" && ferry_fsshell -fs "$FERRY_TEST_HDFS_A" -get /warehouse/events/metadata "$DIR/meta" >/dev/null 2>&1
      else
        rm -rf "$DIR/meta" && cp -a "$DIR/warehouse/events/metadata" "$DIR/meta"
      fi
    fi
  done
done
snapshots=$(find "$DIR/meta" -name 'snap-*.avro' | wc -l)
meta_bytes=$(find "$DIR/meta" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
last_meta=$(find "$DIR/meta" -name '*.metadata.json' -printf '%s %f\n' | sort -k2 | tail -1 | cut -d' ' -f1)
commits=$(find "$DIR/log" -name '*.json' | wc -l)
json_bytes=$(find "$DIR/log" -name '*.json' -printf '%s\n' | awk '{s+=$1} END {print s}')
cp_count=$(find "$DIR/log" -name '*.checkpoint.parquet' | wc -l)
cp_bytes=$(find "$DIR/log" -name '*.checkpoint.parquet' -printf '%s\n' | sort -n | tail -1)
# The last round's Delta table: its small files merged.
export FERRY_CONFIG=$DIR/delta.toml
delta_read() {
  [ "$HDFS" = 1 ] && { echo "-"; return; }
  python3 - "$DIR/warehouse/events" <<'PY'
import os, sys, time, statistics
from deltalake import DeltaTable
t = []
for _ in range(5):
    s = time.perf_counter(); n = DeltaTable(sys.argv[1]).to_pyarrow_table().num_rows; t.append(time.perf_counter() - s)
print(f"{statistics.median(t):.3f} s ({n} rows)")
# Exit without delta-rs' runtime teardown (which aborts now and then).
sys.stdout.flush(); os._exit(0)
PY
}
files_before=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM parts').fetchone()[0])" "$DIR/ledger.db")
read_before=$(delta_read)
/usr/bin/time -f "%e %M" -o "$DIR/t" "$BIN/ferry" compact --target-size 128MiB > "$DIR/compact.out" 2>"$DIR/compact.log" || { cat "$DIR/compact.log" >&2; exit 1; }
read -r compact_wall compact_kib < "$DIR/t"
read_after=$(delta_read)
"$BIN/ferry" verify >/dev/null || { echo "delta bench: verify after the compaction failed" >&2; exit 1; }
merged=$(tail -1 "$DIR/compact.out")
where=$([ "$HDFS" = 1 ] && echo "HDFS (MiniDFS)" || echo "local dir")
out=bench/results/delta-$([ "$HDFS" = 1 ] && echo hdfs- || true)$(date -u +%Y-%m-%d-%H%M).md
{
  echo "# load: Delta and Iceberg tables vs Hive layout ($where), $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD)"
  echo
  echo "$FILES Avro files x $RECORDS events, chunk_size $CHUNK: $chunks chunks, $records records; medians of $ROUNDS rounds each, alternating; release build, $(nproc) cores."
  echo
  echo "| table | load wall | load CPU | peak RSS | records/s | chunks/s |"
  echo "|---|---|---|---|---|---|"
  for fmt in $FORMATS; do
    w=$(cut -d' ' -f1 "$DIR/$fmt.times" | median); c=$(cut -d' ' -f2 "$DIR/$fmt.times" | median); m=$(cut -d' ' -f3 "$DIR/$fmt.times" | median)
    printf '| %s | %.2f s | %.2f s | %d MiB | %.0f | %.1f |\n' "$fmt" "$w" "$c" $((${m%.*} / 1024)) "$(echo "$records / $w" | bc -l)" "$(echo "$chunks / $w" | bc -l)"
  done
  echo
  echo "Delta log of the last round: $commits commits for $chunks chunks (chunks ready together share a commit; the first also creates the table), $(( json_bytes / commits )) bytes per commit on average; $cp_count checkpoint(s), the last $cp_bytes bytes."
  echo
  echo "Iceberg table of the last round (catalog in the ledger): $snapshots snapshots for $chunks chunks (chunks ready together share a snapshot), $meta_bytes bytes of metadata in all (metadata JSON, manifest lists, manifests), the last metadata JSON $last_meta bytes."
  echo
  echo "Compaction of the last round's table (\`ferry compact --target-size 128MiB\`): $files_before part files; $compact_wall s, peak RSS $((compact_kib / 1024)) MiB; $merged"
  echo "A full read by delta-rs (median of 5): $read_before before, $read_after after."
} | tee "$out"
