#!/usr/bin/env bash
# Benchmark (not a test): 1.7M sample events (~1 GB of Avro, null codec) to a published zstd
# table, side by side with polars (read_avro, then write_parquet partitioned by dt, zstd 3).
# polars and ferry-transform run ROUNDS times each, alternating, from the same extracted state;
# each run's wall time is printed and the medians compared. Then copy and load run once.
#   bench/pipeline.sh [DIR] [FILES] [RECORDS_PER_FILE]
#   env: PAYLOAD=words|letters (ferry gen --payload), ROUNDS=3, LEVEL=<transform.compression_level>
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-bench}; FILES=${2:-17}; RECORDS=${3:-100000}
PAYLOAD=${PAYLOAD:-words}; ROUNDS=${ROUNDS:-3}
N=$((FILES * RECORDS))
python3 -c 'import polars' 2>/dev/null || python3 -m pip install -q polars >&2
ferry_python_deps
ferry_release_bins -p ferry-bench -p ferry-tests
rm -rf "$DIR" && mkdir -p "$DIR"
"$BIN/ferry" gen --format avro --codec null --payload "$PAYLOAD" --out "$DIR/in" --files "$FILES" --records "$RECORDS" --block-records 4000 >/dev/null
echo "input: $N events, $(du -sb "$DIR/in" | cut -f1) bytes of Avro (null codec), $PAYLOAD payloads"

measure() { # measure NAME CMD...: wall seconds, CPU seconds and peak RSS (MiB) of CMD
  local name=$1; shift
  /usr/bin/time -f "%e %M %U %S" -o "$DIR/time.$name" "$@" >"$DIR/log.$name" 2>&1 || { cat "$DIR/log.$name"; exit 1; }
  read -r secs kib user sys < "$DIR/time.$name"
  printf '%-28s %7.2f s  %9.0f rec/s  peak %5d MiB  cpu %5.2f s\n' "$name" "$secs" "$(echo "$N / $secs" | bc -l)" $((kib / 1024)) "$(echo "$user + $sys" | bc -l)"
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# polars, the tool a user would pick instead.
cat > "$DIR/polars_run.py" <<'PY'
import sys, glob, polars as pl
src, out = sys.argv[1], sys.argv[2]
df = pl.concat([pl.read_avro(p) for p in sorted(glob.glob(src + "/*.avro"))])
df = df.with_columns(pl.col("ts").dt.date().alias("dt"))
df.write_parquet(out, compression="zstd", compression_level=3, partition_by="dt")
PY

ferry_local_config "$DIR" > "$DIR/ferry.toml"
[ -n "${LEVEL:-}" ] && sed -i "s#^compression_level = .*#compression_level = $LEVEL#" "$DIR/ferry.toml"
export FERRY_CONFIG=$DIR/ferry.toml
measure "ferry-extract" "$BIN/ferry-extract" --once
# The state after extract, so that every transform round starts from it.
sqlite3 "$DIR/ledger.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
cp "$DIR/ledger.db" "$DIR/ledger.extracted"
: > "$DIR/rounds.polars"; : > "$DIR/rounds.ferry"
for r in $(seq "$ROUNDS"); do
  rm -rf "$DIR/polars-out"
  measure "polars read_avro+write #$r" python3 "$DIR/polars_run.py" "$DIR/in" "$DIR/polars-out"
  cut -d' ' -f1 "$DIR/time.polars read_avro+write #$r" >> "$DIR/rounds.polars"
  rm -rf "$DIR/spool" "$DIR/ledger.db-wal" "$DIR/ledger.db-shm"; cp "$DIR/ledger.extracted" "$DIR/ledger.db"
  measure "ferry-transform #$r" "$BIN/ferry-transform" --once
  cut -d' ' -f1 "$DIR/time.ferry-transform #$r" >> "$DIR/rounds.ferry"
done
pm=$(median < "$DIR/rounds.polars"); fm=$(median < "$DIR/rounds.ferry")
echo "  output: polars $(du -sb "$DIR/polars-out" | cut -f1) bytes, ferry-transform $(du -sb "$DIR/spool/events" | cut -f1) bytes"
printf '  medians of %d rounds: polars %.2f s, ferry-transform %.2f s: %.2fx\n' "$ROUNDS" "$pm" "$fm" "$(echo "$pm / $fm" | bc -l)"
measure "ferry-copy" "$BIN/ferry-copy" --once
measure "ferry-load" "$BIN/ferry-load" --once
total=$(echo "$(cut -d' ' -f1 "$DIR/time.ferry-extract") + $fm + $(cut -d' ' -f1 "$DIR/time.ferry-copy") + $(cut -d' ' -f1 "$DIR/time.ferry-load")" | bc -l)
printf '%-28s %7.2f s  %9.0f rec/s\n' "ferry, all four stages" "$total" "$(echo "$N / $total" | bc -l)"
python3 - "$DIR/warehouse/events" "$N" <<'PY'
import sys, duckdb
n = duckdb.sql(f"SELECT count(*), count(DISTINCT event_id) FROM read_parquet('{sys.argv[1]}/**/*.parquet')").fetchall()[0]
print(f"published rows {n[0]}, distinct ids {n[1]}, expected {sys.argv[2]}")
PY
