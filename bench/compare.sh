#!/usr/bin/env bash
# Benchmark (not a test): Ferry next to the tools a user would pick instead, on the same
# generated data in the same run, as one markdown table (also written to bench/results/).
#
#   bench/compare.sh [EVENTS]        (default 1,700,000 events: ~1 GB of Avro; 17000000 for a
#                                     scaling row, e.g. ROUNDS=1 FORMATS=avro POLARS=0 SPARK=0 HDFS=0
#                                     S3=0: ~30 GB of disk at its peak)
#   env: ROUNDS=3 (rounds of every local row, alternating; medians reported)
#        FORMATS="avro jsonl" (the source formats of the local rows; the --watch and HDFS rows
#        need avro)
#        PROFILE=1 (one more transform run per format under `perf record`: the codec's share of
#        the CPU, and how close transform comes to the floor that share sets; installs perf)
#        PAYLOAD=words|letters, FILES=17, CHUNK=64MiB (extract.chunk_size of the local pipeline)
#        POLARS=1 (polars holds all the data in memory: ~1.7 GB at 1.7M events, too much at 17M)
#        SPARK=1 (Spark local mode, pyspark + spark-avro; SPARK_VERSION=4.2.0), HDFS=1 (two MiniDFS clusters: the
#        pipeline over HDFS, ferry-copy next to `hdfs dfs -put`), S3=1 (ferry-copy next to rclone)
#        COLD=0 (before every extract and `cp` row the source files are read once, so both
#        start with them in the page cache, as files that have just landed are; COLD=1 drops
#        the page cache instead, which needs root. In a VM that hands freed memory back to its
#        host, COLD=1 mostly measures the host giving it back: every first touch of a page
#        costs a fault on the host, in the row's own CPU time)
#        TABLE_ONLY=1 (no runs: the table again from what a run left in DIR)
#        KEEP=1 (keep the generated data and outputs in DIR; by default only the measurements stay,
#        as the data of one run at 1.7M events is ~25 GB)
#        HDFS_FILES=100 (the HDFS rows' source: EVENTS in HDFS_FILES files, each spread over ~4
#        days, so that each file is one chunk of ~4 partitions), DIR=/tmp/ferry-compare
#
# Rows and what they compare:
# - disk: writing as many bytes as the largest input (64 MiB pieces, at most 4 GiB) + `sync`,
#   and reading them back past the page cache: the bandwidth extract's and cp's rows are
#   measured against.
# - extract: `cp -r` + `sync` of the source files to the same disk (the floor of a stage that
#   reads every byte once and writes it once, durably) and ferry-extract, for Avro and JSON lines.
# - transform: Avro -> zstd Parquet partitioned by dt with ferry-transform, polars
#   (read_avro + write_parquet) and Spark local mode (spark-avro + parquet, zstd); JSON lines ->
#   the same with ferry-transform and DuckDB (`COPY ... (FORMAT parquet, PARTITION_BY dt,
#   COMPRESSION zstd)`; DuckDB reads Avro only through an extension downloaded at run time).
# - all four stages one after the other, and as four `--watch` services side by side (how they
#   are deployed), with the landing-to-published latency of each chunk (p50 / p99: from the
#   moment the files land in the source directory to the load task's commit in the ledger).
# - HDFS: the four stages with staging on cluster B and the table on cluster A, load alone
#   (publishing chunks already landed), and ferry-copy next to `hdfs dfs -put` of the same spool.
#   Each stage's NameNode RPCs (from the NameNode's /jmx counters) against the rate the NameNode
#   sustains here (Hadoop's NNThroughputBenchmark, create + close, run against cluster A).
# - S3: ferry-copy next to `rclone copy --checksum` of the same spool.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-1700000}; ROUNDS=${ROUNDS:-3}; PAYLOAD=${PAYLOAD:-words}; FILES=${FILES:-17}; CHUNK=${CHUNK:-64MiB}
SPARK=${SPARK:-1}; POLARS=${POLARS:-1}; SPARK_VERSION=${SPARK_VERSION:-4.2.0}; HDFS=${HDFS:-1}; S3=${S3:-1}; HDFS_FILES=${HDFS_FILES:-100}
DIR=${DIR:-/tmp/ferry-compare}; FORMATS=${FORMATS:-avro jsonl}; COLD=${COLD:-0}
PROFILE=${PROFILE:-1}
has() { [[ " $FORMATS " == *" $1 "* ]]; }
has avro || [ "$HDFS$S3" = 00 ] || { echo "the HDFS and S3 rows need FORMATS to include avro" >&2; exit 1; }
if [ "$COLD" = 1 ] && [ -z "${TABLE_ONLY:-}" ] && ! [ -w /proc/sys/vm/drop_caches ]; then
  echo "COLD=1 drops the page cache and needs root" >&2; exit 1
fi
RECORDS=$((EVENTS / FILES)); N=$((RECORDS * FILES))
. scripts/services.sh
ferry_python_deps
python3 -c 'import polars' 2>/dev/null || python3 -m pip install -q polars >&2
if [ "$PROFILE" = 1 ] && [ -z "${TABLE_ONLY:-}" ]; then
  ferry_apt perf linux-perf || { echo "cannot install perf (linux-perf); PROFILE=0 leaves the profiles out" >&2; exit 1; }
fi
if [ "$SPARK" = 1 ]; then
  # pyspark from PyPI, and spark-avro (not part of it) of the same version from Maven Central
  # through Maven (its mirror settings apply; Spark's own Ivy resolver would ignore them).
  [ "$(python3 -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)" = "$SPARK_VERSION" ] ||
    python3 -m pip install -q "pyspark==$SPARK_VERSION" >&2
  SPARK_AVRO=$HOME/.m2/repository/org/apache/spark/spark-avro_2.13/$SPARK_VERSION/spark-avro_2.13-$SPARK_VERSION.jar
  [ -s "$SPARK_AVRO" ] || mvn -q -B dependency:get -Dartifact="org.apache.spark:spark-avro_2.13:$SPARK_VERSION" -Dtransitive=false >&2
  export SPARK_AVRO
fi
ferry_release_bins -p ferry-bench -p ferry-tests
cleanup() {
  [ -n "${WATCH_PIDS:-}" ] && kill $WATCH_PIDS 2>/dev/null
  if [ "$HDFS" = 1 ]; then ferry_stop_minidfs 2>/dev/null || true; fi
  if [ "$S3" = 1 ]; then ferry_stop_s3 2>/dev/null || true; fi
  return 0
}
trap cleanup EXIT
# TABLE_ONLY=1: no runs, only the table from what an earlier run left in DIR.
if [ -z "${TABLE_ONLY:-}" ]; then
rm -rf "$DIR" && mkdir -p "$DIR" bench/results
mkdir -p "$DIR/src-avro" "$DIR/src-jsonl"
if has avro; then
  "$BIN/ferry" gen --format avro --codec null --payload "$PAYLOAD" --out "$DIR/src-avro" --files "$FILES" --records "$RECORDS" --block-records 4000 >/dev/null
fi
if has jsonl; then
  "$BIN/ferry" gen --format jsonl --payload "$PAYLOAD" --out "$DIR/src-jsonl" --files "$FILES" --records "$RECORDS" >/dev/null
fi
bytes_in() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
echo "$(bytes_in "$DIR/src-avro") $(bytes_in "$DIR/src-jsonl")" > "$DIR/input.bytes"
echo "$COLD $(nproc)" > "$DIR/setup"
fi
read -r AVRO_BYTES JSONL_BYTES < "$DIR/input.bytes"
read -r COLD NPROC < "$DIR/setup"
# The disk rows' size: 64 MiB pieces, as many as the largest input takes (1 to 64).
if [ -n "${TABLE_ONLY:-}" ] && [ -s "$DIR/disk.pieces" ]; then
  DISK_PIECES=$(cat "$DIR/disk.pieces")
else
  DISK_PIECES=$(( (AVRO_BYTES > JSONL_BYTES ? AVRO_BYTES : JSONL_BYTES) / (64 << 20) + 1 ))
  DISK_PIECES=$(( DISK_PIECES > 64 ? 64 : DISK_PIECES ))
  echo "$DISK_PIECES" > "$DIR/disk.pieces"
fi
echo "input: $N events ($PAYLOAD payloads): $AVRO_BYTES bytes of Avro (null codec), $JSONL_BYTES bytes of JSON lines" >&2

# measure KEY CMD...: runs CMD under /usr/bin/time; appends "wall rss_kib cpu" to $DIR/m.KEY.
measure() {
  local key=$1; shift
  /usr/bin/time -f "%e %M %U %S" -o "$DIR/time" "$@" >"$DIR/log.$key" 2>&1 || { tail -20 "$DIR/log.$key" >&2; echo "$key failed" >&2; exit 1; }
  read -r secs kib user sys < "$DIR/time"
  echo "$secs $kib $(echo "$user + $sys" | bc -l)" >> "$DIR/m.$key"
  echo "  $key: ${secs} s, peak $((kib / 1024)) MiB" >&2
}
# out KEY BYTES: remembers a row's output size.
out() { echo "$2" > "$DIR/o.$1"; }
# spent PATH...: an output already measured; removed unless KEEP=1 (at 17M events the outputs
# of one round would not fit on the disk together).
spent() { [ "${KEEP:-}" = 1 ] || rm -rf "$@"; }
# settle [DIR]: writes back what is dirty, then (COLD=0) reads DIR's files once, so that the
# next row finds its input in the page cache, or (COLD=1) drops the page cache.
settle() {
  sync
  if [ "$COLD" = 1 ]; then echo 1 > /proc/sys/vm/drop_caches; elif [ -n "${1:-}" ]; then cat "$1"/* > /dev/null; fi
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print 0; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# row LABEL KEY...: the medians over rounds of the sum of KEYs' wall and CPU, and the largest RSS.
row() {
  local label=$1; shift
  python3 - "$DIR" "$N" "$label" "$@" >> "$DIR/table.md" <<'PY'
import sys, statistics, os
d, n, label, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
per_byte = int(os.environ.get("ROW_BYTES", "0"))
runs = [[tuple(map(float, l.split())) for l in open(f"{d}/m.{k}")] for k in keys]
rounds = min(len(r) for r in runs)
walls = [sum(r[i][0] for r in runs) for i in range(rounds)]
cpus = [sum(r[i][2] for r in runs) for i in range(rounds)]
rss = max(r[i][1] for r in runs for i in range(rounds)) / 1024
wall = statistics.median(walls)
o = f"{d}/o.{keys[-1]}"
size = f"{int(open(o).read()) / 1e6:,.1f} MB" if os.path.exists(o) else ""
each = " / ".join(f"{w:.2f}" for w in walls)
rate = f"{per_byte / wall / 1e6:,.0f} MB/s" if per_byte else f"{n / wall:,.0f}"
print(f"| {label} | {wall:.2f} s ({each}) | {rate} | {statistics.median(cpus):.1f} s | {rss:,.0f} MiB | {size} |")
PY
}
section() { printf '| **%s** | | | | | |\n' "$1" >> "$DIR/table.md"; }

config() { # config NAME SOURCE_DIR [EXTRA_TOML]: a local-dir pipeline under $DIR/NAME
  local d=$DIR/$1
  mkdir -p "$d"
  cat > "$d/ferry.toml" <<EOF
[ledger]
url = "sqlite://$d/ledger.db"
[source]
url = "$2"
settle = "0s"
[staging]
url = "$d/staging"
[spool]
dir = "$d/spool"
[destination]
url = "$d/warehouse"
[table]
name = "events"
partition_by = ["dt"]
columns = [
  { name = "event_id", type = "string", nullable = false },
  { name = "ts", type = "timestamp", nullable = false },
  { name = "host", type = "string", nullable = false },
  { name = "kind", type = "string", nullable = false },
  { name = "user_id", type = "long", nullable = false },
  { name = "payload", type = "string", nullable = false },
  { name = "score", type = "double" },
]
[extract]
chunk_size = "$CHUNK"
[transform]
derive = { dt = "date(ts)" }
${3:-}
EOF
}
fresh() { rm -rf "$DIR/$1/staging" "$DIR/$1/spool" "$DIR/$1/warehouse" "$DIR/$1"/ledger.db*; }
stage() { FERRY_CONFIG=$DIR/$1/ferry.toml "$BIN/ferry-$2" --once; }

cat > "$DIR/polars_avro.py" <<'PY'
import sys, glob, polars as pl
src, out = sys.argv[1], sys.argv[2]
df = pl.concat([pl.read_avro(p) for p in sorted(glob.glob(src + "/*.avro"))])
df = df.with_columns(pl.col("ts").dt.date().alias("dt"))
df.write_parquet(out, compression="zstd", compression_level=3, partition_by="dt")
PY
cat > "$DIR/duckdb_jsonl.py" <<'PY'
import sys, duckdb
src, out = sys.argv[1], sys.argv[2]
duckdb.sql("SET TimeZone = 'UTC'")
duckdb.sql(f"""COPY (SELECT *, CAST(ts AS DATE) AS dt FROM read_json_auto('{src}/*.jsonl'))
  TO '{out}' (FORMAT parquet, PARTITION_BY dt, COMPRESSION zstd)""")
PY
cat > "$DIR/spark_avro.py" <<'PY'
import sys, os
from pyspark.sql import SparkSession, functions as F
src, out = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[*]")
         .config("spark.jars", os.environ["SPARK_AVRO"])
         .config("spark.driver.memory", "4g").config("spark.sql.session.timeZone", "UTC")
         .config("spark.ui.enabled", "false").getOrCreate())
df = spark.read.format("avro").load(src)
(df.withColumn("dt", F.to_date("ts")).write.partitionBy("dt")
   .option("compression", "zstd").parquet(out))
# The JVM is not this process's waited-for child, so /usr/bin/time sees neither its memory nor
# its CPU: both read from /proc before it stops (peak RSS: VmHWM; CPU: utime + stime).
kids = {}
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        kids.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
    except OSError:
        pass
todo, hwm, cpu = list(kids.get(os.getpid(), [])), 0, 0.0
while todo:
    pid = todo.pop()
    todo += kids.get(pid, [])
    try:
        hwm = max([hwm] + [int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM:")])
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
open(os.environ["SPARK_JVM"], "w").write(f"{hwm} {cpu:.2f}\n")
spark.stop()
PY
if [ -z "${TABLE_ONLY:-}" ]; then
if [ "$SPARK" = 1 ]; then
  # Once before the rounds, so that a broken Spark stops the run early.
  "$BIN/ferry" gen --format avro --codec null --out "$DIR/spark-warm/in" --files 1 --records 10 >/dev/null
  SPARK_JVM=$DIR/spark.jvm python3 "$DIR/spark_avro.py" "$DIR/spark-warm/in" "$DIR/spark-warm/out" > "$DIR/log.spark-warm" 2>&1 || { tail "$DIR/log.spark-warm" >&2; exit 1; }
fi

# profile FORMAT: the codec's share of transform's CPU. Transform once more under `perf record`
# from the same staged chunks (the ledger as extract left it); its spool replaces the measured
# run's, which is the same.
profile() {
  local f=$1
  rm -rf "$DIR/$f/spool" "$DIR/$f"/ledger.db*; cp "$DIR/$f/ledger.extracted" "$DIR/$f/ledger.db"
  perf record -q -F 499 -o "$DIR/perf.$f" -- \
    env FERRY_CONFIG="$DIR/$f/ferry.toml" "$BIN/ferry-transform" --once > "$DIR/log.perf-$f" 2>&1 ||
    { tail "$DIR/log.perf-$f" >&2; echo "perf record of transform failed (PROFILE=0 leaves it out)" >&2; exit 1; }
  # Shares of the samples: the zstd codec (ZSTD_/HUF_/HIST_/FSE_ functions), blake3, the kernel.
  # The limits table applies them to the measured (unprofiled) runs' CPU.
  perf report -i "$DIR/perf.$f" --no-children --sort dso,sym --stdio 2>/dev/null | awk '
    /^ +[0-9.]+%/ { p = $1; sub("%", "", p)
      if ($0 ~ /(ZSTD_|HUF_|HIST_|FSE_|ZDICT)/) z += p; else if ($0 ~ /blake3/) b += p; else if ($0 ~ /\[k\]/) k += p }
    END { printf "%.1f %.1f %.1f\n", z, b, k }' > "$DIR/profile.$f"
  rm -f "$DIR/perf.$f"
}

config avro "$DIR/src-avro"; config jsonl "$DIR/src-jsonl"
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  # The disk itself: random bytes (64 MiB from /dev/urandom, repeated) written and synced,
  # then read back past the page cache (O_DIRECT). As many as the largest input: a VM's disk
  # may absorb a small write faster than a large one.
  rm -f "$DIR/disk.bin"; head -c 64M /dev/urandom > "$DIR/disk.rnd"; settle
  measure disk-write bash -c 'for i in $(seq "$2"); do cat "$0"; done > "$1" && sync' "$DIR/disk.rnd" "$DIR/disk.bin" "$DISK_PIECES"
  measure disk-read dd if="$DIR/disk.bin" of=/dev/null bs=16M iflag=direct
  rm -f "$DIR/disk.bin" "$DIR/disk.rnd"
  for f in $FORMATS; do
    rm -rf "$DIR/cp-$f"; settle "$DIR/src-$f"
    measure "cp-$f" bash -c 'cp -r "$0" "$1" && sync' "$DIR/src-$f" "$DIR/cp-$f"
    spent "$DIR/cp-$f"
    fresh "$f"; settle "$DIR/src-$f"
    measure "extract-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-extract" --once' "$DIR/$f" "$BIN"
    out "extract-$f" "$(du -sb "$DIR/$f/staging" | cut -f1)"
    sqlite3 "$DIR/$f/ledger.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
    cp "$DIR/$f/ledger.db" "$DIR/$f/ledger.extracted"
    measure "transform-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-transform" --once' "$DIR/$f" "$BIN"
    out "transform-$f" "$(du -sb "$DIR/$f/spool/events" | cut -f1)"
    [ "$PROFILE" = 1 ] && [ "$r" = 1 ] && profile "$f"
    spent "$DIR/$f/staging"
    measure "copy-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-copy" --once' "$DIR/$f" "$BIN"
    measure "load-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-load" --once' "$DIR/$f" "$BIN"
    out "load-$f" "$(du -sb --exclude=_ferry "$DIR/$f/warehouse/events" | cut -f1)"
    spent "$DIR/$f/spool" "$DIR/$f/warehouse"
  done
  if [ "$POLARS" = 1 ] && has avro; then
    rm -rf "$DIR/polars-out"
    measure polars-avro python3 "$DIR/polars_avro.py" "$DIR/src-avro" "$DIR/polars-out"
    out polars-avro "$(du -sb "$DIR/polars-out" | cut -f1)"
    spent "$DIR/polars-out"
  fi
  if has jsonl; then
    rm -rf "$DIR/duckdb-out"
    measure duckdb-jsonl python3 "$DIR/duckdb_jsonl.py" "$DIR/src-jsonl" "$DIR/duckdb-out"
    out duckdb-jsonl "$(du -sb "$DIR/duckdb-out" | cut -f1)"
    spent "$DIR/duckdb-out"
  fi
  if [ "$SPARK" = 1 ] && has avro; then
    rm -rf "$DIR/spark-out"
    SPARK_JVM=$DIR/spark.jvm measure spark-avro python3 "$DIR/spark_avro.py" "$DIR/src-avro" "$DIR/spark-out"
    # The JVM's peak RSS and CPU, added to what /usr/bin/time saw of the Python driver.
    python3 - "$DIR" <<'PY'
import sys
d = sys.argv[1]
hwm, cpu = map(float, open(f"{d}/spark.jvm").read().split())
lines = open(f"{d}/m.spark-avro").read().splitlines()
wall, rss, pycpu = map(float, lines[-1].split())
lines[-1] = f"{wall} {int(max(rss, hwm))} {pycpu + cpu:.2f}"
open(f"{d}/m.spark-avro", "w").write("\n".join(lines) + "\n")
PY
    out spark-avro "$(du -sb --exclude='.*' --exclude=_SUCCESS "$DIR/spark-out" | cut -f1)"
    spent "$DIR/spark-out"
  fi
  has avro || continue

  # The four stages as services, side by side: files land (one rename each) into an empty
  # source directory watched by all four; done when the ledger has every chunk published.
  config watch "$DIR/watch-in"; fresh watch; rm -rf "$DIR/watch-in" "$DIR/watch-drop"; mkdir -p "$DIR/watch-in"
  # Hard links: the files land by rename as copies would, without a second copy on the disk.
  cp -al "$DIR/src-avro" "$DIR/watch-drop"; settle "$DIR/watch-drop"
  WATCH_PIDS=""
  for s in extract transform copy load; do
    /usr/bin/time -f "%e %M %U %S" -o "$DIR/time.watch-$s" env FERRY_CONFIG="$DIR/watch/ferry.toml" \
      "$BIN/ferry-$s" --watch --poll 100ms > "$DIR/log.watch-$s" 2>&1 &
    WATCH_PIDS="$WATCH_PIDS $!"
  done
  sleep 2
  python3 - "$DIR" "$FILES" >> "$DIR/m.watch" <<'PY'
import sys, os, time, sqlite3, glob
d, files = sys.argv[1], int(sys.argv[2])
start = time.time()
for f in sorted(glob.glob(f"{d}/watch-drop/*.avro")):
    os.rename(f, f"{d}/watch-in/{os.path.basename(f)}")
db = sqlite3.connect(f"{d}/watch/ledger.db", timeout=30)
q = lambda s: db.execute(s).fetchone()[0]
while True:
    chunked = q("SELECT COUNT(*) FROM source_files WHERE state = 'chunked'")
    if chunked == files and q("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'") == q("SELECT COUNT(*) FROM chunks"):
        break
    if time.time() - start > 1800:
        sys.exit("the watch pipeline did not finish in 30 minutes")
    time.sleep(0.02)
wall = q("SELECT MAX(finalized_at) FROM tasks WHERE stage = 'load'") / 1000 - start
lat = sorted(r[0] / 1000 - start for r in db.execute("SELECT finalized_at FROM tasks WHERE stage = 'load'"))
p = lambda x: lat[min(len(lat) - 1, int(round(x * (len(lat) - 1))))]
print(f"{wall:.3f} {p(0.5):.3f} {p(0.99):.3f} {len(lat)}")
PY
  for pid in $WATCH_PIDS; do pkill -TERM -P "$pid" 2>/dev/null || true; done
  wait $WATCH_PIDS 2>/dev/null || true; WATCH_PIDS=""
  python3 - "$DIR" >> "$DIR/m.watch-cpu" <<'PY'
import sys
d = sys.argv[1]
cpu, rss = 0.0, 0
for s in ["extract", "transform", "copy", "load"]:
    secs, kib, user, sys_ = open(f"{d}/time.watch-{s}").read().strip().split("\n")[-1].split()
    cpu += float(user) + float(sys_); rss = max(rss, int(kib))
print(f"{cpu:.2f} {rss}")
PY
  out watch "$(du -sb --exclude=_ferry "$DIR/watch/warehouse/events" | cut -f1)"
  spent "$DIR/watch-in" "$DIR/watch/staging" "$DIR/watch/spool" "$DIR/watch/warehouse"
done


# A spool of real chunks for the copy rows, and its ledger: restored before every copy round.
spool_for() { # spool_for NAME DEST_TOML: extract + transform (untimed) of the HDFS rows' source
  config "$1" "$DIR/src-hdfs" "$2"
  fresh "$1"; stage "$1" extract >/dev/null 2>&1; stage "$1" transform >/dev/null 2>&1
  sqlite3 "$DIR/$1/ledger.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
  rm -rf "$DIR/$1/spool.orig"; cp -al "$DIR/$1/spool" "$DIR/$1/spool.orig"; cp "$DIR/$1/ledger.db" "$DIR/$1/ledger.orig"
}
restore() { rm -rf "$DIR/$1/spool" "$DIR/$1"/ledger.db*; cp -al "$DIR/$1/spool.orig" "$DIR/$1/spool"; cp "$DIR/$1/ledger.orig" "$DIR/$1/ledger.db"; }

if [ "$HDFS" = 1 ] || [ "$S3" = 1 ]; then
  # The same events in HDFS_FILES files, each spread over ~4 days: one chunk of ~4 partitions
  # each, the shape where publishing costs the most per record.
  "$BIN/ferry" gen --format avro --codec null --payload "$PAYLOAD" --out "$DIR/src-hdfs" --files "$HDFS_FILES" \
    --records $((N / HDFS_FILES)) --block-records 4000 --gap-ms $((4 * 86400000 * HDFS_FILES / N)) >/dev/null
fi
if [ "$HDFS" = 1 ]; then
  . scripts/minidfs.sh
  ferry_build_minidfs
  ferry_start_minidfs A
  ferry_start_minidfs B
  # nn_rpc.py snap FILE: every RPC method's call count so far on both clusters' NameNodes (their
  # /jmx page); nn_rpc.py diff BEFORE AFTER: "client_calls datanode_calls top_methods" between two.
  cat > "$DIR/nn_rpc.py" <<'PY'
import sys, json, os, re, time, urllib.request
# What DataNodes call (heartbeats, block reports): the NameNode's work for written blocks,
# not the client's calls.
DATANODE = {"SendHeartbeat", "BlockReceivedAndDeleted", "BlockReport", "CacheReport", "VersionRequest",
            "RegisterDatanode", "ErrorReport", "ReportBadBlocks", "CommitBlockSynchronization"}
if sys.argv[1] == "snap":
    # The page shows the metrics system's snapshot, taken every second here (*.period=1 in
    # tests/minidfs's hadoop-metrics2.properties): wait for one taken after the last call.
    time.sleep(1.5)
    ops = {}
    for conf in os.environ["NN_CONFS"].split():
        site = open(f"{conf}/hdfs-site.xml").read()
        http = re.search(r"<name>dfs.namenode.http-address</name><value>([^<]+)</value>", site).group(1)
        q = "Hadoop:service=NameNode,name=RpcDetailedActivityForPort*"
        for bean in json.load(urllib.request.urlopen(f"http://{http}/jmx?qry={q}", timeout=30))["beans"]:
            for k, v in bean.items():
                # "Overall..." counts the same calls again, "Deferred..." a subset of them.
                if k.endswith("NumOps") and not k.startswith(("Deferred", "Overall")):
                    ops[k[:-6]] = ops.get(k[:-6], 0) + v
    json.dump(ops, open(sys.argv[2], "w"))
else:
    a, b = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
    d = {k: v - a.get(k, 0) for k, v in b.items() if v - a.get(k, 0) > 0}
    client = {k: v for k, v in d.items() if k not in DATANODE}
    top = ",".join(f"{k}={v}" for k, v in sorted(client.items(), key=lambda kv: -kv[1])[:4])
    print(sum(client.values()), sum(v for k, v in d.items() if k in DATANODE), top or "-")
PY
  export NN_CONFS="$FERRY_TEST_HDFS_A_CONF $FERRY_TEST_HDFS_B_CONF"
  # measure_rpc KEY CMD...: measure, and the NameNode calls CMD made appended to $DIR/rpc.KEY.
  measure_rpc() {
    python3 "$DIR/nn_rpc.py" snap "$DIR/nn.before"
    measure "$@"
    python3 "$DIR/nn_rpc.py" snap "$DIR/nn.after"
    python3 "$DIR/nn_rpc.py" diff "$DIR/nn.before" "$DIR/nn.after" >> "$DIR/rpc.$1"
  }
  for r in $(seq "$ROUNDS"); do
    echo "HDFS round $r of $ROUNDS" >&2
    # The four stages: staging on cluster B, the table on cluster A (seed 001's layout).
    config hdfs "$DIR/src-hdfs" ""
    sed -i -e "s#^url = \"$DIR/hdfs/staging\"#url = \"$FERRY_TEST_HDFS_B/staging$r\"#" \
      -e "s#^url = \"$DIR/hdfs/warehouse\"#url = \"$FERRY_TEST_HDFS_A/warehouse$r\"#" "$DIR/hdfs/ferry.toml"
    fresh hdfs
    for s in extract transform copy load; do
      measure_rpc "hdfs-$s" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-$2" --once' "$DIR/hdfs" "$BIN" "$s"
    done
    sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) || ' chunks of ' || printf('%.1f', AVG(n)) || ' partitions' FROM (SELECT COUNT(*) n FROM parts GROUP BY chunk_id)" > "$DIR/hdfs.shape"
    [ "$(sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'")" = \
      "$(sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) FROM chunks")" ] || { echo "HDFS: not everything was published" >&2; exit 1; }
  done
  # The NameNode's own limit here: Hadoop's NNThroughputBenchmark against cluster A, creating and
  # closing empty files (two RPCs each, no blocks) from 8 threads.
  cat > "$DIR/nnbench.log4j" <<'EOF'
log4j.rootLogger=WARN,out
log4j.logger.org.apache.hadoop.hdfs.server.namenode.NNThroughputBenchmark=INFO
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.Target=System.out
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=%m%n
EOF
  for r in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086
    java $FERRY_FSSHELL_JAVA_OPTS -Dlog4j.configuration="file:$DIR/nnbench.log4j" -cp "$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" \
      org.apache.hadoop.hdfs.server.namenode.NNThroughputBenchmark -fs "$FERRY_TEST_HDFS_A" -op create -threads 8 -files 4000 -close \
      > "$DIR/log.nnbench" 2>&1 || { tail "$DIR/log.nnbench" >&2; echo "NNThroughputBenchmark failed" >&2; exit 1; }
    sed -n 's/^ *Ops per sec: *//p' "$DIR/log.nnbench" | tail -1 >> "$DIR/m.nnbench"
  done
  [ -s "$DIR/m.nnbench" ] || { echo "NNThroughputBenchmark printed no rate" >&2; exit 1; }
  # ferry-copy next to Hadoop's own client, from the same spool.
  spool_for hdfscopy ""
  export -f ferry_fsshell ferry_build_minidfs _ferry_java_built _ferry_java_build
  export FERRY_MINIDFS_CLASSPATH_FILE FERRY_MINIDFS_HOME FERRY_MINIDFS_BUILD FERRY_FSSHELL_JAVA_OPTS FERRY_CACHE
  out hdfs-put "$(du -sb "$DIR/hdfscopy/spool.orig/events" | cut -f1)"; out hdfscopy-ferry "$(cat "$DIR/o.hdfs-put")"
  for r in $(seq "$ROUNDS"); do
    measure_rpc hdfs-put bash -c 'ferry_fsshell -fs "$0" -put "$1" "/put$2" 2>/dev/null' "$FERRY_TEST_HDFS_A" "$DIR/hdfscopy/spool.orig/events" "$r"
    restore hdfscopy
    sed -i "s#^url = \"$DIR/hdfscopy/warehouse.*\"#url = \"$FERRY_TEST_HDFS_A/copy$r\"#" "$DIR/hdfscopy/ferry.toml"
    measure_rpc hdfscopy-ferry bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-copy" --once' "$DIR/hdfscopy" "$BIN"
    sed -i "s#^url = \"$FERRY_TEST_HDFS_A/copy$r\"#url = \"$DIR/hdfscopy/warehouse\"#" "$DIR/hdfscopy/ferry.toml"
  done
fi

if [ "$S3" = 1 ]; then
  . scripts/s3.sh
  ferry_start_s3
  spool_for s3copy ""
  out rclone "$(du -sb "$DIR/s3copy/spool.orig/events" | cut -f1)"; out s3-copy "$(cat "$DIR/o.rclone")"
  ferry_rclone_s3_env
  for r in $(seq "$ROUNDS"); do
    measure rclone rclone copy --checksum --transfers 4 "$DIR/s3copy/spool.orig/events" "ferrys3:ferry/rclone$r"
    restore s3copy
    config s3copy "$DIR/src-avro" "$(printf '[destination.store.s3]\nendpoint = "%s"\npath_style = true\nca_bundle = "%s"\n' "$FERRY_TEST_S3_ENDPOINT" "$FERRY_TEST_S3_CA")"
    sed -i "s#^url = \"$DIR/s3copy/warehouse\"#url = \"s3://ferry/copy$r\"#" "$DIR/s3copy/ferry.toml"
    measure s3-copy bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-copy" --once' "$DIR/s3copy" "$BIN"
  done
fi

fi

# The table (medians over rounds).
{
  echo "| run | wall (median; each round) | records/s | CPU | peak RSS | output |"
  echo "|---|---|---|---|---|---|"
} > "$DIR/table.md"
if [ "$COLD" = 1 ]; then CACHE="page cache dropped before each row"; else CACHE="the source in the page cache, as just-landed files are"; fi
section "disk: $((DISK_PIECES * 64)) MiB of random bytes"
ROW_BYTES=$((DISK_PIECES << 26)) row "write + \`sync\`" disk-write
ROW_BYTES=$((DISK_PIECES << 26)) row "read back past the page cache (\`dd iflag=direct\`)" disk-read
section "extract: read every byte, write it to staging (durably; $CACHE)"
if has avro; then
  row "\`cp -r\` + \`sync\`, Avro ($((AVRO_BYTES / 1000000)) MB)" cp-avro
  row "ferry-extract, Avro" extract-avro
fi
if has jsonl; then
  row "\`cp -r\` + \`sync\`, JSON lines ($((JSONL_BYTES / 1000000)) MB)" cp-jsonl
  row "ferry-extract, JSON lines" extract-jsonl
fi
if has avro; then
  section "transform: Avro -> zstd Parquet, partitioned by dt"
  row "ferry-transform" transform-avro
  if [ "$POLARS" = 1 ]; then row "polars read_avro + write_parquet (zstd 3)" polars-avro; fi
  if [ "$SPARK" = 1 ]; then row "Spark $(python3 -c 'import pyspark; print(pyspark.__version__)') local[*], spark-avro -> parquet (zstd)" spark-avro; fi
fi
if has jsonl; then
  section "transform: JSON lines -> zstd Parquet, partitioned by dt"
  row "ferry-transform" transform-jsonl
  row "DuckDB $(python3 -c 'import duckdb; print(duckdb.__version__)') COPY (FORMAT parquet, PARTITION_BY dt, COMPRESSION zstd)" duckdb-jsonl
fi
if has avro; then
section "the whole pipeline on local dirs (SQLite ledger), Avro"
row "ferry, four stages one after the other" extract-avro transform-avro copy-avro load-avro
python3 - "$DIR" "$N" >> "$DIR/table.md" <<'PY'
import sys, statistics
d, n = sys.argv[1], int(sys.argv[2])
w = [tuple(map(float, l.split())) for l in open(f"{d}/m.watch")]
c = [tuple(map(float, l.split())) for l in open(f"{d}/m.watch-cpu")]
t = [float(l.split()[0]) for l in open(f"{d}/m.transform-avro")]
wall = statistics.median(x[0] for x in w)
each = " / ".join(f"{x[0]:.2f}" for x in w)
size = int(open(f"{d}/o.watch").read()) / 1e6
print(f"| ferry, four `--watch` services side by side | {wall:.2f} s ({each}) | {n / wall:,.0f} | "
      f"{statistics.median(x[0] for x in c):.1f} s | {max(x[1] for x in c) / 1024:,.0f} MiB (largest) | {size:,.1f} MB |")
print(f"| ...as a multiple of ferry-transform alone ({statistics.median(t):.2f} s) | {wall / statistics.median(t):.2f}x | | | | |")
print(f"| ...landing -> published per chunk, p50 / p99 ({int(w[0][3])} chunks) | "
      f"{statistics.median(x[1] for x in w):.2f} s / {statistics.median(x[2] for x in w):.2f} s | | | | |")
PY
fi
if [ "$HDFS" = 1 ]; then
  section "HDFS (two MiniDFS clusters on this machine), Avro in $HDFS_FILES files: $(cat "$DIR/hdfs.shape")"
  row "ferry, four stages one after the other" hdfs-extract hdfs-transform hdfs-copy hdfs-load
  row "ferry-extract (to staging on cluster B)" hdfs-extract
  row "ferry-load alone (publishing landed chunks on cluster A)" hdfs-load
  row "hdfs dfs -put of the spool (JVM start included)" hdfs-put
  row "ferry-copy of the same spool (blake3 on every byte)" hdfscopy-ferry
fi
if [ "$S3" = 1 ]; then
  section "S3 (versitygw over TLS on this machine), the same spool"
  row "rclone copy --checksum --transfers 4" rclone
  row "ferry-copy (blake3 on every byte)" s3-copy
fi

# How far each stage is from the limit of this machine that bounds it (medians over rounds).
python3 - "$DIR" "$N" "$AVRO_BYTES" "$JSONL_BYTES" "$COLD" "$NPROC" "$FORMATS" "$DISK_PIECES" > "$DIR/limits.md" <<'PY'
import sys, os, statistics as st
d, n, sizes, cold, cores, formats = sys.argv[1], int(sys.argv[2]), {"avro": int(sys.argv[3]), "jsonl": int(sys.argv[4])}, sys.argv[5] == "1", int(sys.argv[6]), sys.argv[7].split()
disk_bytes = int(sys.argv[8]) << 26
names = {"avro": "Avro", "jsonl": "JSON lines"}
def m(key, col=0):
    p = f"{d}/m.{key}"
    return st.median(float(l.split()[col]) for l in open(p)) if os.path.exists(p) else None
print("| stage | its limit here | the limit's time | measured | fraction of the limit |")
print("|---|---|---|---|---|")
w, r = m("disk-write"), m("disk-read")
if w and r:
    wbw, rbw = disk_bytes / w, disk_bytes / r
    for f in formats:
        b, t, c = sizes[f], m(f"extract-{f}"), m(f"cp-{f}")
        if not t:
            continue
        # Every byte written durably; read from the disk too when the cache was dropped (the
        # device reads and writes at once: the slower of the two). A VM's disk may absorb one
        # size faster than another, so `cp` of the same files, when faster, shows what it can.
        disk = max(b / wbw, b / rbw) if cold else b / wbw
        what = f"read {rbw / 1e6:,.0f} MB/s, write {wbw / 1e6:,.0f} MB/s, at once" if cold else f"write + sync {wbw / 1e6:,.0f} MB/s"
        floor = min(disk, c) if c else disk
        print(f"| ferry-extract, {names[f]} ({b / 1e6:,.0f} MB) | the disk: {what} ({disk:.2f} s), or `cp -r` + `sync` of the same files "
              f"if faster ({c:.2f} s) | {floor:.2f} s | {t:.2f} s | {floor / t:.0%} |")
for f in formats:
    p = f"{d}/profile.{f}"
    if os.path.exists(p):
        # The codec's share of the samples of the run under perf, applied to the measured runs.
        z, b3, k = map(float, open(p).read().split()[:3])
        wall, cpu = m(f"transform-{f}"), m(f"transform-{f}", 2)
        floor = z / 100 * cpu / cores
        print(f"| ferry-transform, {names[f]} | zstd level 3 on {cores} cores: the codec's {z:.1f}% of {cpu:.1f} s of CPU "
              f"(blake3 {b3:.1f}%, kernel {k:.1f}%; shares from `perf record`) | {floor:.2f} s | {wall:.2f} s | {floor / wall:.0%} |")
if os.path.exists(f"{d}/m.watch") and os.path.exists(f"{d}/m.watch-cpu"):
    wall, cpu, t = m("watch"), m("watch-cpu"), m("transform-avro")
    floor = max(cpu / cores, t)
    print(f"| four `--watch` services, Avro | the CPU of the four stages on {cores} cores ({cpu:.1f} s), or transform alone ({t:.2f} s) if longer | {floor:.2f} s | {wall:.2f} s | {floor / wall:.0%} |")
if os.path.exists(f"{d}/m.nnbench"):
    cap = 2 * m("nnbench")  # create + complete per file
    print(f"| NameNode (cluster A) | NNThroughputBenchmark: create + close of empty files, 8 threads | {cap:,.0f} RPC/s | | |")
    for key, label in (("hdfs-extract", "ferry-extract to cluster B"), ("hdfs-transform", "ferry-transform from cluster B"),
                       ("hdfs-copy", "ferry-copy to cluster A"), ("hdfs-load", "ferry-load on cluster A"),
                       ("hdfs-put", "`hdfs dfs -put` of the spool"), ("hdfscopy-ferry", "ferry-copy of the same spool")):
        p = f"{d}/rpc.{key}"
        if not os.path.exists(p):
            continue
        rows = [l.split() for l in open(p)]
        calls = st.median(int(x[0]) for x in rows)
        dn = st.median(int(x[1]) for x in rows)
        wall = m(key)
        print(f"| {label} | the NameNode's RPC rate: {calls:,.0f} client calls ({rows[-1][2].replace(',', ', ')}), "
              f"{dn:,.0f} DataNode calls | {calls / cap:.2f} s | {wall:.2f} s | {calls / wall / cap:.0%} |")
PY
# The run's time (TABLE_ONLY=1 keeps it).
[ -z "${TABLE_ONLY:-}" ] || [ ! -s "$DIR/stamp" ] || stamp=$(cat "$DIR/stamp")
stamp=${stamp:-$(date -u +%Y-%m-%d-%H%M)}; echo "$stamp" > "$DIR/stamp"
{
  echo "# bench/compare.sh $EVENTS ($stamp UTC; $ROUNDS rounds; $PAYLOAD payloads; $(nproc) cores)"
  echo
  echo "$N events: $(has avro && echo "$AVRO_BYTES bytes of Avro (null codec)")$(has avro && has jsonl && echo ", ")$(has jsonl && echo "$JSONL_BYTES bytes of JSON lines"). Release build."
  # The clusters' shape, when the run changed it (DataNodes, replication, NameNode settings).
  if [ "$HDFS" = 1 ] && [ -n "${FERRY_MINIDFS_ARGS:-}" ]; then
    echo
    echo "MiniDFS clusters A and B started with \`$FERRY_MINIDFS_ARGS\`."
  fi
  # The clusters' JVM, when the run changed it (the tests' default stops at the C1 compiler).
  if [ "$HDFS" = 1 ] && [ -n "${FERRY_MINIDFS_JAVA_OPTS:-}" ]; then
    echo
    echo "MiniDFS JVMs run with \`$FERRY_MINIDFS_JAVA_OPTS\`."
  fi
  echo
  cat "$DIR/table.md"
  echo
  echo "How far each stage is from the limit that bounds it on this machine (the limit's time: what the"
  echo "stage would take at that limit and nothing else; fraction: that time over the stage's own):"
  echo
  cat "$DIR/limits.md"
} > "bench/results/compare-$EVENTS-$stamp.md"
cat "bench/results/compare-$EVENTS-$stamp.md"
# The measurements (m.*, o.*, logs) stay for TABLE_ONLY=1; the data goes unless KEEP=1.
if [ "${KEEP:-}" != 1 ]; then
  echo "removing the data in $DIR ($(du -sh "$DIR" | cut -f1); KEEP=1 keeps it)" >&2
  find "$DIR" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
fi
