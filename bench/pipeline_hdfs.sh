#!/usr/bin/env bash
# Benchmark (not a test): the whole pipeline over HDFS, as in seed 001. Local source ->
# ferry-extract -> staging on MiniDFS "B" -> ferry-transform -> local spool -> ferry-copy ->
# MiniDFS "A" -> ferry-load -> a table on A. SQLite ledger, every chunk hashed at every hop.
#
#   bench/pipeline_hdfs.sh [EVENTS] [CHUNK]     (defaults: 1.7M events, 64MiB chunks)
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-1700000}; CHUNK=${2:-64MiB}
. scripts/services.sh
. scripts/minidfs.sh
ferry_release_bins
DIR=$(mktemp -d /tmp/ferry-hdfs-bench.XXXXXX)
trap 'ferry_stop_minidfs; rm -rf "$DIR"' EXIT
ferry_build_minidfs
ferry_start_minidfs A
ferry_start_minidfs B
FILES=17
"$BIN/ferry" gen --format avro --codec null --out "$DIR/in" --files $FILES --records $((EVENTS / FILES)) --block-records 4000 >/dev/null
N=$(( (EVENTS / FILES) * FILES ))
echo "input: $N events, $(du -sb "$DIR/in" | cut -f1) bytes of Avro (null codec); chunks of $CHUNK"
cat > "$DIR/ferry.toml" <<EOF
[ledger]
url = "sqlite://$DIR/ledger.db"
[source]
url = "$DIR/in"
settle = "0s"
[staging]
url = "$FERRY_TEST_HDFS_B/staging"
[spool]
dir = "$DIR/spool"
[destination]
url = "$FERRY_TEST_HDFS_A/warehouse"
[table]
name = "events"
partition_by = ["dt"]
[extract]
chunk_size = "$CHUNK"
[transform]
derive = { dt = "date(ts)" }
EOF
total=0
for s in extract transform copy load; do
  /usr/bin/time -f "%e %M" -o "$DIR/t.$s" env FERRY_CONFIG="$DIR/ferry.toml" "$BIN/ferry-$s" --once > "$DIR/log.$s" 2>&1 || { tail "$DIR/log.$s"; exit 1; }
  read -r secs kib < "$DIR/t.$s"
  total=$(echo "$total + $secs" | bc)
  printf '%-16s %7.2f s  %9.0f rec/s  peak %5d MiB\n' "ferry-$s" "$secs" "$(echo "$N / $secs" | bc -l)" $((kib / 1024))
done
printf '%-16s %7.2f s  %9.0f rec/s\n' "all four" "$total" "$(echo "$N / $total" | bc -l)"
"$BIN/ferry" --ledger "sqlite://$DIR/ledger.db" status | sed -n '/published/,$p'
