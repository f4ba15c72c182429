#!/usr/bin/env bash
# Benchmark (not a test): Ferry next to the tools a user would pick instead, on the same
# generated data in the same run, as one markdown table (also written to bench/results/).
#
#   bench/compare.sh [EVENTS]        (default 1,700,000 events: ~1 GB of Avro; 17000000 for a
#                                     scaling row)
#   env: ROUNDS=3 (rounds of every local row, alternating; medians reported)
#        PAYLOAD=words|letters, FILES=17, CHUNK=64MiB (extract.chunk_size of the local pipeline)
#        SPARK=1 (Spark local mode, pyspark + spark-avro; SPARK_VERSION=4.2.0), HDFS=1 (two MiniDFS clusters: the
#        pipeline over HDFS, ferry-copy next to `hdfs dfs -put`), S3=1 (ferry-copy next to rclone)
#        TABLE_ONLY=1 (no runs: the table again from what a run left in DIR)
#        KEEP=1 (keep the generated data and outputs in DIR; by default only the measurements stay,
#        as the data of one run at 1.7M events is ~25 GB)
#        HDFS_FILES=100 (the HDFS rows' source: EVENTS in HDFS_FILES files, each spread over ~4
#        days, so that each file is one chunk of ~4 partitions), DIR=/tmp/ferry-compare
#
# Rows and what they compare:
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
# - S3: ferry-copy next to `rclone copy --checksum` of the same spool.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-1700000}; ROUNDS=${ROUNDS:-3}; PAYLOAD=${PAYLOAD:-words}; FILES=${FILES:-17}; CHUNK=${CHUNK:-64MiB}
SPARK=${SPARK:-1}; SPARK_VERSION=${SPARK_VERSION:-4.2.0}; HDFS=${HDFS:-1}; S3=${S3:-1}; HDFS_FILES=${HDFS_FILES:-100}
DIR=${DIR:-/tmp/ferry-compare}
RECORDS=$((EVENTS / FILES)); N=$((RECORDS * FILES))
. scripts/services.sh
ferry_python_deps
python3 -c 'import polars' 2>/dev/null || python3 -m pip install -q polars >&2
if [ "$SPARK" = 1 ]; then
  # pyspark from PyPI, and spark-avro (not part of it) of the same version from Maven Central
  # through Maven (its mirror settings apply; Spark's own Ivy resolver would ignore them).
  [ "$(python3 -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)" = "$SPARK_VERSION" ] ||
    python3 -m pip install -q "pyspark==$SPARK_VERSION" >&2
  SPARK_AVRO=$HOME/.m2/repository/org/apache/spark/spark-avro_2.13/$SPARK_VERSION/spark-avro_2.13-$SPARK_VERSION.jar
  [ -s "$SPARK_AVRO" ] || mvn -q -B dependency:get -Dartifact="org.apache.spark:spark-avro_2.13:$SPARK_VERSION" -Dtransitive=false >&2
  export SPARK_AVRO
fi
ferry_release_bins
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
"$BIN/ferry" gen --format avro --codec null --payload "$PAYLOAD" --out "$DIR/src-avro" --files "$FILES" --records "$RECORDS" --block-records 4000 >/dev/null
"$BIN/ferry" gen --format jsonl --payload "$PAYLOAD" --out "$DIR/src-jsonl" --files "$FILES" --records "$RECORDS" >/dev/null
echo "$(du -sb "$DIR/src-avro" | cut -f1) $(du -sb "$DIR/src-jsonl" | cut -f1)" > "$DIR/input.bytes"
fi
read -r AVRO_BYTES JSONL_BYTES < "$DIR/input.bytes"
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
median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print 0; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# row LABEL KEY...: the medians over rounds of the sum of KEYs' wall and CPU, and the largest RSS.
row() {
  local label=$1; shift
  python3 - "$DIR" "$N" "$label" "$@" >> "$DIR/table.md" <<'PY'
import sys, statistics, os
d, n, label, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
runs = [[tuple(map(float, l.split())) for l in open(f"{d}/m.{k}")] for k in keys]
rounds = min(len(r) for r in runs)
walls = [sum(r[i][0] for r in runs) for i in range(rounds)]
cpus = [sum(r[i][2] for r in runs) for i in range(rounds)]
rss = max(r[i][1] for r in runs for i in range(rounds)) / 1024
wall = statistics.median(walls)
o = f"{d}/o.{keys[-1]}"
size = f"{int(open(o).read()) / 1e6:,.1f} MB" if os.path.exists(o) else ""
each = " / ".join(f"{w:.2f}" for w in walls)
print(f"| {label} | {wall:.2f} s ({each}) | {n / wall:,.0f} | {statistics.median(cpus):.1f} s | {rss:,.0f} MiB | {size} |")
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

config avro "$DIR/src-avro"; config jsonl "$DIR/src-jsonl"
for r in $(seq "$ROUNDS"); do
  echo "round $r of $ROUNDS" >&2
  for f in avro jsonl; do
    rm -rf "$DIR/cp-$f"; sync
    measure "cp-$f" bash -c 'cp -r "$0" "$1" && sync' "$DIR/src-$f" "$DIR/cp-$f"
    fresh "$f"; sync
    measure "extract-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-extract" --once' "$DIR/$f" "$BIN"
    out "extract-$f" "$(du -sb "$DIR/$f/staging" | cut -f1)"
    sqlite3 "$DIR/$f/ledger.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
    cp "$DIR/$f/ledger.db" "$DIR/$f/ledger.extracted"
    measure "transform-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-transform" --once' "$DIR/$f" "$BIN"
    out "transform-$f" "$(du -sb "$DIR/$f/spool/events" | cut -f1)"
    measure "copy-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-copy" --once' "$DIR/$f" "$BIN"
    measure "load-$f" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-load" --once' "$DIR/$f" "$BIN"
    out "load-$f" "$(du -sb --exclude=_ferry "$DIR/$f/warehouse/events" | cut -f1)"
  done
  rm -rf "$DIR/polars-out"
  measure polars-avro python3 "$DIR/polars_avro.py" "$DIR/src-avro" "$DIR/polars-out"
  out polars-avro "$(du -sb "$DIR/polars-out" | cut -f1)"
  rm -rf "$DIR/duckdb-out"
  measure duckdb-jsonl python3 "$DIR/duckdb_jsonl.py" "$DIR/src-jsonl" "$DIR/duckdb-out"
  out duckdb-jsonl "$(du -sb "$DIR/duckdb-out" | cut -f1)"
  if [ "$SPARK" = 1 ]; then
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
  fi

  # The four stages as services, side by side: files land (one rename each) into an empty
  # source directory watched by all four; done when the ledger has every chunk published.
  config watch "$DIR/watch-in"; fresh watch; rm -rf "$DIR/watch-in" "$DIR/watch-drop"; mkdir -p "$DIR/watch-in"
  cp -r "$DIR/src-avro" "$DIR/watch-drop"; sync
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
  for r in $(seq "$ROUNDS"); do
    echo "HDFS round $r of $ROUNDS" >&2
    # The four stages: staging on cluster B, the table on cluster A (seed 001's layout).
    config hdfs "$DIR/src-hdfs" ""
    sed -i -e "s#^url = \"$DIR/hdfs/staging\"#url = \"$FERRY_TEST_HDFS_B/staging$r\"#" \
      -e "s#^url = \"$DIR/hdfs/warehouse\"#url = \"$FERRY_TEST_HDFS_A/warehouse$r\"#" "$DIR/hdfs/ferry.toml"
    fresh hdfs
    for s in extract transform copy load; do
      measure "hdfs-$s" bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-$2" --once' "$DIR/hdfs" "$BIN" "$s"
    done
    sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) || ' chunks of ' || printf('%.1f', AVG(n)) || ' partitions' FROM (SELECT COUNT(*) n FROM parts GROUP BY chunk_id)" > "$DIR/hdfs.shape"
    [ "$(sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state = 'done'")" = \
      "$(sqlite3 "$DIR/hdfs/ledger.db" "SELECT COUNT(*) FROM chunks")" ] || { echo "HDFS: not everything was published" >&2; exit 1; }
  done
  # ferry-copy next to Hadoop's own client, from the same spool.
  spool_for hdfscopy ""
  export -f ferry_fsshell ferry_build_minidfs _ferry_minidfs_built
  export FERRY_MINIDFS_CLASSPATH_FILE FERRY_MINIDFS_HOME FERRY_FSSHELL_JAVA_OPTS
  out hdfs-put "$(du -sb "$DIR/hdfscopy/spool.orig/events" | cut -f1)"; out hdfscopy-ferry "$(cat "$DIR/o.hdfs-put")"
  for r in $(seq "$ROUNDS"); do
    measure hdfs-put bash -c 'ferry_fsshell -fs "$0" -put "$1" "/put$2" 2>/dev/null' "$FERRY_TEST_HDFS_A" "$DIR/hdfscopy/spool.orig/events" "$r"
    restore hdfscopy
    sed -i "s#^url = \"$DIR/hdfscopy/warehouse.*\"#url = \"$FERRY_TEST_HDFS_A/copy$r\"#" "$DIR/hdfscopy/ferry.toml"
    measure hdfscopy-ferry bash -c 'FERRY_CONFIG=$0/ferry.toml "$1/ferry-copy" --once' "$DIR/hdfscopy" "$BIN"
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
section "extract: read every byte, write it to staging (durably)"
row "\`cp -r\` + \`sync\`, Avro ($((AVRO_BYTES / 1000000)) MB)" cp-avro
row "ferry-extract, Avro" extract-avro
row "\`cp -r\` + \`sync\`, JSON lines ($((JSONL_BYTES / 1000000)) MB)" cp-jsonl
row "ferry-extract, JSON lines" extract-jsonl
section "transform: Avro -> zstd Parquet, partitioned by dt"
row "ferry-transform" transform-avro
row "polars read_avro + write_parquet (zstd 3)" polars-avro
if [ "$SPARK" = 1 ]; then row "Spark $(python3 -c 'import pyspark; print(pyspark.__version__)') local[*], spark-avro -> parquet (zstd)" spark-avro; fi
section "transform: JSON lines -> zstd Parquet, partitioned by dt"
row "ferry-transform" transform-jsonl
row "DuckDB $(python3 -c 'import duckdb; print(duckdb.__version__)') COPY (FORMAT parquet, PARTITION_BY dt, COMPRESSION zstd)" duckdb-jsonl
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
stamp=$(date -u +%Y-%m-%d-%H%M)
{
  echo "# bench/compare.sh $EVENTS ($stamp UTC; $ROUNDS rounds; $PAYLOAD payloads; $(nproc) cores)"
  echo
  echo "$N events: $AVRO_BYTES bytes of Avro (null codec), $JSONL_BYTES bytes of JSON lines. Release build."
  echo
  cat "$DIR/table.md"
} > "bench/results/compare-$EVENTS-$stamp.md"
cat "bench/results/compare-$EVENTS-$stamp.md"
# The measurements (m.*, o.*, logs) stay for TABLE_ONLY=1; the data goes unless KEEP=1.
if [ "${KEEP:-}" != 1 ]; then
  echo "removing the data in $DIR ($(du -sh "$DIR" | cut -f1); KEEP=1 keeps it)" >&2
  find "$DIR" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
fi
