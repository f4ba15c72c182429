#!/usr/bin/env bash
# Benchmark (not a test): landing -> published latency of the four stages as `--watch`
# services (how they are deployed), at a steady arrival rate below capacity, on local dirs and
# the embedded SQLite ledger; with HDFS=1, staging on one MiniDFS cluster (B) and the table on
# another (A), the second seed's case (the source, the spool and the ledger stay local).
#
# 1. capacity: a backlog of files lands at once; files/s until the last one is published.
# 2. for each load in LOADS (percent of that capacity): files land one by one (each written,
#    then renamed into the source directory, as a careful producer does) at a steady rate for
#    DURATION seconds; then the run drains. Latency = the load task's commit in the ledger minus the
#    file's mtime at landing, for every file that landed after the first 10 s of the phase.
#    Where the time goes, per hop, from the ledger's own timestamps: landing -> chunk staged
#    (extract's poll, settle, split), and for transform, copy and load the wait for a claim
#    (created -> attempted: the stage's poll, a busy stage) and the work (attempted -> done).
# 3. idle: the CPU the four idle services use over IDLE seconds, as % of one core.
#
#   bench/latency.sh [DIR]
#   env: BIN=<dir of release binaries> (built when unset), LOADS="25 50 75", DURATION=90 (seconds per load),
#        RECORDS=13000 (events per file: ~8 MiB of Avro, one 8 MiB chunk), BACKLOG=150,
#        CAPACITY=<files/s> (skip the backlog; two builds at the same rates), IDLE=60, STAGE_ARGS="" (extra flags for every stage, e.g. "--poll 500ms"),
#        OUT=<file> (also write the table there), HDFS=1 (staging and table on two MiniDFS clusters)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-latency}
if [ -z "${BIN:-}" ]; then ferry_release_bins; fi
rm -rf "$DIR" && mkdir -p "$DIR"
ferry_local_config "$DIR" avro 8MiB > "$DIR/ferry.toml"
if [ "${HDFS:-0}" = 1 ]; then
  . scripts/minidfs.sh
  trap 'ferry_stop_minidfs 2>/dev/null || true' EXIT
  ferry_start_minidfs A
  ferry_start_minidfs B
  sed -i -e "s#^url = \"$DIR/staging\"#url = \"$FERRY_TEST_HDFS_B/staging\"#" \
    -e "s#^url = \"$DIR/warehouse\"#url = \"$FERRY_TEST_HDFS_A/warehouse\"#" "$DIR/ferry.toml"
  grep -q "^url = \"$FERRY_TEST_HDFS_A/warehouse\"" "$DIR/ferry.toml" || { echo "latency: the table is not on HDFS" >&2; exit 1; }
  grep -q "^url = \"$FERRY_TEST_HDFS_B/staging\"" "$DIR/ferry.toml" || { echo "latency: staging is not on HDFS" >&2; exit 1; }
fi
BIN=$BIN DIR=$DIR LOADS=${LOADS:-25 50 75} SECONDS_PER_LOAD=${DURATION:-90} RECORDS=${RECORDS:-13000} \
  BACKLOG=${BACKLOG:-150} CAPACITY=${CAPACITY:-} IDLE=${IDLE:-60} STAGE_ARGS=${STAGE_ARGS:-} OUT=${OUT:-} STORES=$([ "${HDFS:-0}" = 1 ] && echo hdfs || echo local) \
  python3 bench/latency.py
