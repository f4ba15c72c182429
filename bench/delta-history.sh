#!/usr/bin/env bash
# Benchmark (not a test): a Delta table with a long history. Another writer has committed
# COMMITS times to the table before Ferry loads into it (each commit adds a small file and takes
# the previous one out, with a txn of its own, so the table's active files stay few while its log
# grows; a checkpoint every 100 commits, as delta-rs writes them; tombstones and txns past their
# retention). Then, for each size in SIZES, `ferry-load --once` of the same chunks is timed with
# its peak RSS, and so are `ferry verify` (a snapshot of the table and a check of every chunk)
# and `ferry vacuum --dry-run` (the log's files and its tombstones). Flat rows across sizes mean
# Ferry's cost follows the table, not its history. One markdown table, also written to
# bench/results/delta-history-<date>.md.
#
#   bench/delta-history.sh [DIR]   (default /tmp/ferry-delta-history)
#   env: SIZES="1000 10000", FILES=4, RECORDS=20000 (per file), CHUNK=1MiB, BIN (release
#        binaries; built when unset)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
DIR=${1:-/tmp/ferry-delta-history}
SIZES=${SIZES:-"1000 10000"}; FILES=${FILES:-4}; RECORDS=${RECORDS:-20000}; CHUNK=${CHUNK:-1MiB}
if [ -z "${BIN:-}" ]; then ferry_release_bins; fi
rm -rf "$DIR" && mkdir -p "$DIR"
ferry_local_config "$DIR" avro "$CHUNK" | sed 's#^\[destination\].*#&\ntable_format = "delta"#' > "$DIR/ferry.toml"
grep -q '^table_format = "delta"' "$DIR/ferry.toml" || { echo "history bench: no [destination] section to set" >&2; exit 1; }
export FERRY_CONFIG=$DIR/ferry.toml
"$BIN/ferry" gen --format avro --codec deflate --out "$DIR/in" --files "$FILES" --records "$RECORDS" >/dev/null
"$BIN/ferry-extract" --once >/dev/null 2>&1
"$BIN/ferry-transform" --once >/dev/null 2>&1
mkdir -p "$DIR/saved"
cp -a "$DIR/ledger.db"* "$DIR/spool" "$DIR/saved/"
# The table's first commit as Ferry makes it (protocol and metaData), kept to start each history.
"$BIN/ferry-copy" --once >/dev/null 2>&1
"$BIN/ferry-load" --once >/dev/null 2>&1
head -c 100000 "$DIR/warehouse/events/_delta_log/00000000000000000000.json" | grep -E '^\{"(protocol|metaData)"' > "$DIR/first.json"
[ "$(wc -l < "$DIR/first.json")" = 2 ] || { echo "history bench: no protocol and metaData in Ferry's first commit" >&2; exit 1; }
chunks=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM chunks').fetchone()[0])" "$DIR/ledger.db")
records=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT SUM(records) FROM parts').fetchone()[0])" "$DIR/ledger.db")

# history TABLE N: the other writer's N commits after the first, then its checkpoints.
history() {
  python3 - "$1" "$2" "$DIR/first.json" <<'PY'
import json, os, sys, time
import pyarrow as pa, pyarrow.parquet as pq
from deltalake import DeltaTable
table, n, first = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = os.path.join(table, "_delta_log")
os.makedirs(log, exist_ok=True)
lines = open(first).read().splitlines()
meta = json.loads(lines[1])["metaData"]
schema = json.loads(meta["schemaString"])
part = meta["partitionColumns"]
# One small data file of the table's columns but the partition ones, linked under each name.
cols = {f["name"]: f["type"] for f in schema["fields"] if f["name"] not in part}
types = {"string": pa.string(), "long": pa.int64(), "integer": pa.int32(), "double": pa.float64(), "timestamp": pa.timestamp("us", "UTC"), "date": pa.date32(), "boolean": pa.bool_()}
row = {k: {"string": "x", "long": 1, "integer": 1, "double": 1.0, "boolean": True}.get(t) for k, t in cols.items()}
sample = os.path.join(table, "_history_sample.parquet")
pq.write_table(pa.table({k: pa.array([row[k]], type=types.get(t, pa.string())) for k, t in cols.items()}), sample)
size = os.path.getsize(sample)
pdir = "/".join(f"{p}=2026-01-01" for p in part)
os.makedirs(os.path.join(table, pdir), exist_ok=True)
now = int(time.time() * 1000)
old = now - 30 * 86400 * 1000
with open(os.path.join(log, "%020d.json" % 0), "w") as f:
    f.write("\n".join(lines) + "\n")
for v in range(1, n + 1):
    rel = f"{pdir}/history-{v:06d}.parquet"
    os.link(sample, os.path.join(table, rel))
    acts = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "engineInfo": "history-bench/1"}},
        {"add": {"path": rel, "partitionValues": {p: "2026-01-01" for p in part}, "size": size, "modificationTime": now,
                 "dataChange": True, "stats": json.dumps({"numRecords": 1})}},
        {"txn": {"appId": f"history-bench-{v % 500}", "version": v, "lastUpdated": old}},
    ]
    if v > 1:
        acts.append({"remove": {"path": f"{pdir}/history-{v - 1:06d}.parquet", "deletionTimestamp": old, "dataChange": True,
                                "extendedFileMetadata": True, "partitionValues": {p: "2026-01-01" for p in part}, "size": size}})
    with open(os.path.join(log, "%020d.json" % v), "w") as f:
        f.write("\n".join(json.dumps(a) for a in acts) + "\n")
    if v % 100 == 0:
        DeltaTable(table, version=v).create_checkpoint()
os.remove(sample)
sys.stdout.flush(); os._exit(0)
PY
}

rows=()
for n in $SIZES; do
  rm -rf "$DIR/ledger.db"* "$DIR/spool" "$DIR/warehouse"
  cp -a "$DIR/saved/." "$DIR/"
  t0=$(date +%s.%N)
  history "$DIR/warehouse/events" "$n"
  made=$(echo "$(date +%s.%N) - $t0" | bc -l)
  cp_bytes=$(find "$DIR/warehouse/events/_delta_log" -name '*.checkpoint.parquet' -printf '%s\n' | sort -n | tail -1)
  "$BIN/ferry-copy" --once >/dev/null 2>"$DIR/copy.log" || { cat "$DIR/copy.log" >&2; exit 1; }
  /usr/bin/time -f "%e %M" -o "$DIR/t" "$BIN/ferry-load" --once >/dev/null 2>"$DIR/load.log" || { cat "$DIR/load.log" >&2; exit 1; }
  read -r load_wall load_kib < "$DIR/t"
  left=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(\"SELECT COUNT(*) FROM tasks WHERE state <> 'done'\").fetchone()[0])" "$DIR/ledger.db")
  [ "$left" = 0 ] || { echo "history bench: $left tasks not done after load ($n commits)" >&2; cat "$DIR/load.log" >&2; exit 1; }
  /usr/bin/time -f "%e %M" -o "$DIR/t" "$BIN/ferry" verify >"$DIR/verify.out" 2>&1 || { cat "$DIR/verify.out" >&2; exit 1; }
  read -r verify_wall verify_kib < "$DIR/t"
  /usr/bin/time -f "%e %M" -o "$DIR/t" "$BIN/ferry" vacuum --dry-run >"$DIR/vacuum.out" 2>&1 || { cat "$DIR/vacuum.out" >&2; exit 1; }
  read -r vacuum_wall vacuum_kib < "$DIR/t"
  commits=$(find "$DIR/warehouse/events/_delta_log" -name '*.json' | wc -l)
  rows+=("$(printf '| %d | %d | %.1f s | %d KiB | %.2f s | %d MiB | %.2f s | %d MiB | %.2f s | %d MiB |' "$n" "$commits" "$made" \
    $((cp_bytes / 1024)) "$load_wall" $((load_kib / 1024)) "$verify_wall" $((verify_kib / 1024)) "$vacuum_wall" $((vacuum_kib / 1024)))")
done
out=bench/results/delta-history-$(date -u +%Y-%m-%d-%H%M).md
{
  echo "# Delta load into a table with a long history (local dir), $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD)"
  echo
  echo "Another writer's commits before the load (each adds a one-row file and takes the previous one out; a checkpoint every 100; tombstones and txns past retention), then \`ferry-load --once\` of $chunks chunks ($records records, $FILES Avro files, chunk_size $CHUNK); release build, $(nproc) cores, one run each."
  echo
  echo "| other writer's commits | commits in the log after | history made in | last checkpoint | load wall | load peak RSS | verify wall | verify peak RSS | vacuum --dry-run wall | vacuum peak RSS |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} | tee "$out"
