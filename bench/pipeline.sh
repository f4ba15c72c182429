#!/usr/bin/env bash
# Benchmark (not a test): 1.7M sample events (~1 GB of Avro, null codec) to a published zstd
# table, side by side with polars (read_avro, then write_parquet partitioned by dt, zstd 3).
# Reports wall time, records/s, peak RSS and output size of each.
#   bench/pipeline.sh [DIR] [FILES] [RECORDS_PER_FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-bench}; FILES=${2:-17}; RECORDS=${3:-100000}
N=$((FILES * RECORDS))
python3 -c 'import polars' 2>/dev/null || python3 -m pip install -q polars >&2
ferry_python_deps
cargo build --release --workspace --bins >&2
BIN=$CARGO_TARGET_DIR/release
rm -rf "$DIR" && mkdir -p "$DIR"
"$BIN/ferry" gen --format avro --codec null --out "$DIR/in" --files "$FILES" --records "$RECORDS" --block-records 4000 >/dev/null
echo "input: $N events, $(du -sb "$DIR/in" | cut -f1) bytes of Avro (null codec)"

measure() { # measure NAME CMD...: wall seconds and peak RSS (MiB) of CMD
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$DIR/time.$name" "$@" >"$DIR/log.$name" 2>&1 || { cat "$DIR/log.$name"; exit 1; }
  read -r secs kib < "$DIR/time.$name"
  printf '%-28s %7.2f s  %9.0f rec/s  peak %5d MiB\n' "$name" "$secs" "$(echo "$N / $secs" | bc -l)" $((kib / 1024))
}

# polars, the tool a user would pick instead.
cat > "$DIR/polars_run.py" <<'PY'
import sys, glob, polars as pl
src, out = sys.argv[1], sys.argv[2]
df = pl.concat([pl.read_avro(p) for p in sorted(glob.glob(src + "/*.avro"))])
df = df.with_columns(pl.col("ts").dt.date().alias("dt"))
df.write_parquet(out, compression="zstd", compression_level=3, partition_by="dt")
PY
measure "polars read_avro+write" python3 "$DIR/polars_run.py" "$DIR/in" "$DIR/polars-out"
echo "  polars output: $(du -sb "$DIR/polars-out" | cut -f1) bytes"

sed -e "s#sqlite://ferry-ledger.db#sqlite://$DIR/ledger.db#" -e "s#\"/data/incoming\"#\"$DIR/in\"#" \
    -e "s#\"/data/staging\"#\"$DIR/staging\"#" -e "s#\"/var/spool/ferry\"#\"$DIR/spool\"#" \
    -e "s#\"/data/warehouse\"#\"$DIR/warehouse\"#" -e 's#settle = "10s"#settle = "0s"#' \
    deploy/ferry.example.toml > "$DIR/ferry.toml"
export FERRY_CONFIG=$DIR/ferry.toml
measure "ferry-extract" "$BIN/ferry-extract" --once
measure "ferry-transform" "$BIN/ferry-transform" --once
echo "  ferry transform output: $(du -sb "$DIR/spool/events" | cut -f1) bytes"
measure "ferry-copy" "$BIN/ferry-copy" --once
measure "ferry-load" "$BIN/ferry-load" --once
total=0
for s in ferry-extract ferry-transform ferry-copy ferry-load; do total=$(echo "$total + $(cut -d' ' -f1 "$DIR/time.$s")" | bc -l); done
printf '%-28s %7.2f s  %9.0f rec/s\n' "ferry, all four stages" "$total" "$(echo "$N / $total" | bc -l)"
python3 - "$DIR/warehouse/events" "$N" <<'PY'
import sys, duckdb
n = duckdb.sql(f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet('{sys.argv[1]}/**/*.parquet')").fetchall()[0]
print(f"published rows {n[0]}, distinct ids {n[1]}, expected {sys.argv[2]}")
PY
