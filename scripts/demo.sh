#!/usr/bin/env bash
# README command 1: the whole pipeline on the embedded default (SQLite ledger + local dirs)
# over generated sample data. Builds Ferry, generates events, runs the four stages once each,
# then prints the ledger summary and the published table's row count per partition.
#   scripts/demo.sh [DIR] [FORMAT: avro|jsonl|csv] [FILES] [RECORDS_PER_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-demo}; FORMAT=${2:-avro}; FILES=${3:-4}; RECORDS=${4:-25000}
# DuckDB (which reads the table back at the end) downloads while Ferry builds.
ferry_python_deps &
deps=$!
# The demo profile: unoptimised, without debug info (see Cargo.toml); deploy/install.sh builds release.
cargo build --profile demo -p ferry-extract -p ferry-transform -p ferry-copy -p ferry-load -p ferry-admin >&2
BIN=$CARGO_TARGET_DIR/demo
wait "$deps"
ferry_python_path
rm -rf "$DIR" && mkdir -p "$DIR"
"$BIN/ferry" gen --format "$FORMAT" --codec deflate --out "$DIR/in" --files "$FILES" --records "$RECORDS" >/dev/null
ferry_local_config "$DIR" "$FORMAT" 8MiB > "$DIR/ferry.toml"
export FERRY_CONFIG=$DIR/ferry.toml
for stage in extract transform copy load; do
  "$BIN/ferry-$stage" --once
done
echo
"$BIN/ferry" --ledger "sqlite://$DIR/ledger.db" status
echo
echo "published table $DIR/warehouse/events, read back by DuckDB:"
python3 - "$DIR/warehouse/events" <<'PY'
import sys, duckdb
for dt, n in duckdb.sql(f"SELECT dt, count(*) FROM read_parquet('{sys.argv[1]}/**/*.parquet', hive_partitioning=true) GROUP BY dt ORDER BY dt").fetchall():
    print(f"  dt={dt}  {n:>8} rows")
PY
