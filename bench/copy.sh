#!/usr/bin/env bash
# Benchmark (not a test): ferry-copy from a local spool to a real destination, next to the tool
# a user would pick instead, and again under faults.
#
#   bench/copy.sh hdfs [EVENTS]   ferry-copy -> MiniDFS "A"  vs  hdfs dfs -put (Hadoop's FsShell);
#                                 then resets and swallowed replies on NameNode RPCs (fault proxy)
#   bench/copy.sh s3 [EVENTS]     ferry-copy -> versitygw over TLS  vs  rclone copy --checksum;
#                                 then 10% hung, 5% reset-at-any-byte, 5% trickling connections
#
# Reports MB/s, peak RSS, and under faults: faults injected, attempts redone, bytes redone (from
# the ledger's attempts.redone_bytes), parts sent again inside an attempt, hedges started / won.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${1:?hdfs or s3}; EVENTS=${2:-600000}
. scripts/services.sh
ferry_release_bins -p ferry-bench -p ferry-tests
DIR=$(mktemp -d /tmp/ferry-copy-bench.XXXXXX)
trap 'ferry_stop_all' EXIT
ferry_stop_all() { [ -n "${PROXY_PID:-}" ] && kill "$PROXY_PID" 2>/dev/null; ferry_stop_minidfs 2>/dev/null || true; ferry_stop_s3 2>/dev/null || true; rm -rf "$DIR"; }

case $BACKEND in
  hdfs) . scripts/minidfs.sh; ferry_build_minidfs; ferry_start_minidfs A; TARGET=${FERRY_TEST_HDFS_A#hdfs://} ;;
  s3) . scripts/s3.sh; ferry_start_s3; TARGET=${FERRY_TEST_S3_ENDPOINT#https://} ;;
  *) echo "backend: hdfs or s3" >&2; exit 2 ;;
esac

# A spool of real chunks: EVENTS sample events through extract + transform (CHUNK, default
# 4 MiB of Avro: ~2.3 MB of Parquet each, so faults "per 20 chunks" have chunks to hit).
"$BIN/ferry" gen --format avro --codec null --out "$DIR/in" --files 6 --records $((EVENTS / 6)) --block-records 4000 >/dev/null
cat > "$DIR/base.toml" <<EOF
[ledger]
url = "sqlite://$DIR/ledger.db"
[source]
url = "$DIR/in"
settle = "0s"
[staging]
url = "$DIR/staging"
[spool]
dir = "$DIR/spool"
[table]
name = "events"
partition_by = ["dt"]
[extract]
chunk_size = "${CHUNK:-4MiB}"
[transform]
derive = { dt = "date(ts)" }
EOF
dest_section() { # dest_section ENDPOINT_HOSTPORT PREFIX
  case $BACKEND in
    hdfs) printf '[destination]\nurl = "hdfs://%s/%s"\n' "$1" "$2" ;;
    s3) printf '[destination]\nurl = "s3://ferry/%s"\n[destination.store.s3]\nendpoint = "https://%s"\npath_style = true\nca_bundle = "%s"\n' \
          "$2" "$1" "$FERRY_TEST_S3_CA" ;;
  esac
}
{ cat "$DIR/base.toml"; dest_section "$TARGET" prep; } > "$DIR/ferry.toml"
FERRY_CONFIG=$DIR/ferry.toml "$BIN/ferry-extract" --once >/dev/null 2>&1
FERRY_CONFIG=$DIR/ferry.toml "$BIN/ferry-transform" --once >/dev/null 2>&1
cp -al "$DIR/spool" "$DIR/spool.orig"; sqlite3 "$DIR/ledger.db" ".backup '$DIR/ledger.orig'"
BYTES=$(du -sb "$DIR/spool.orig/events" | cut -f1)
FILES=$(find "$DIR/spool.orig/events" -name '*.parquet' | wc -l)
CHUNKS=$(sqlite3 "$DIR/ledger.db" "SELECT COUNT(*) FROM chunks")
echo "spool: $FILES Parquet files in $CHUNKS chunks, $BYTES bytes ($EVENTS events)"

rate() { echo "scale=1; $BYTES / $1 / 1000000" | bc; }
report() { # report NAME SECS KIB [CPU_SECS]
  printf '%-40s %7.2f s  %7s MB/s  peak %5d MiB  cpu %6s s\n' "$1" "$2" "$(rate "$2")" $(($3 / 1024)) "${4:-?}"
}
REPEAT=${REPEAT:-3}

# The tool a user would pick instead.
case $BACKEND in
  hdfs)
    export -f ferry_fsshell ferry_build_minidfs _ferry_java_built _ferry_java_build
    export FERRY_MINIDFS_CLASSPATH_FILE FERRY_MINIDFS_HOME FERRY_FSSHELL_JAVA_OPTS
    /usr/bin/time -f "%e %M %U %S" -o "$DIR/t.jvm" bash -c 'ferry_fsshell -fs "$0" -ls / >/dev/null 2>&1' "$FERRY_TEST_HDFS_A"
    /usr/bin/time -f "%e %M %U %S" -o "$DIR/t.put" bash -c 'ferry_fsshell -fs "$0" -put "$1" /put-bench 2>/dev/null' \
      "$FERRY_TEST_HDFS_A" "$DIR/spool.orig/events"
    read -r s k u y < "$DIR/t.put"; report "hdfs dfs -put (incl. JVM start)" "$s" "$k" "$(echo "$u + $y" | bc)"
    read -r j _ < "$DIR/t.jvm"; report "hdfs dfs -put (minus ${j}s JVM start)" "$(echo "$s - $j" | bc)" "$k"
    # Hadoop's client sleeps 400 ms before it retries complete() on a block not yet reported;
    # a user who knows would shorten that.
    /usr/bin/time -f "%e %M %U %S" -o "$DIR/t.put2" bash -c 'ferry_fsshell -D dfs.client.block.write.locateFollowingBlock.initial.delay.ms=10 -fs "$0" -put "$1" /put-bench2 2>/dev/null' \
      "$FERRY_TEST_HDFS_A" "$DIR/spool.orig/events"
    read -r s k u y < "$DIR/t.put2"; report "hdfs dfs -put, complete() delay 10 ms" "$s" "$k" "$(echo "$u + $y" | bc)"
    ;;
  s3)
    ferry_rclone_s3_env
    for r in $(seq 1 "$REPEAT"); do
      /usr/bin/time -f "%e %M %U %S" -o "$DIR/t.rclone" rclone copy --checksum --transfers 4 "$DIR/spool.orig/events" "ferrys3:ferry/rclone-bench-$r" 2>/dev/null
      read -r s k u y < "$DIR/t.rclone"; report "rclone copy --checksum --transfers 4" "$s" "$k" "$(echo "$u + $y" | bc)"
    done
    ;;
esac

run_copy() { # run_copy NAME PREFIX HOSTPORT
  rm -rf "$DIR/spool" "$DIR"/ledger.db* "$DIR/copy.log"; cp -al "$DIR/spool.orig" "$DIR/spool"; cp "$DIR/ledger.orig" "$DIR/ledger.db"
  { cat "$DIR/base.toml"; dest_section "$3" "$2"; [ -z "${COPY_CONCURRENCY:-}" ] || printf '[copy]\nconcurrency = %s\n' "$COPY_CONCURRENCY"; } > "$DIR/ferry.toml"
  # Cron-style: --once until nothing is left (a retry waits out its backoff in the ledger).
  /usr/bin/time -f "%e %M %U %S" -o "$DIR/t.copy" bash -c '
    for round in $(seq 1 20); do
      env RUST_LOG=info FERRY_CONFIG="$1/ferry.toml" "$2/ferry-copy" --once >> "$1/copy.log" 2>&1 || exit 1
      [ "$(sqlite3 "$1/ledger.db" "SELECT COUNT(*) FROM tasks WHERE stage = '"'copy'"' AND state <> '"'done'"'")" = 0 ] && exit 0
      sleep 0.5
    done; exit 1' _ "$DIR" "$BIN" || { tail "$DIR/copy.log"; exit 1; }
  read -r s k u y < "$DIR/t.copy"; report "$1" "$s" "$k" "$(echo "$u + $y" | bc)"
}
for r in $(seq 1 "$REPEAT"); do run_copy "ferry-copy (blake3 on every byte)" "clean-$r" "$TARGET"; done

# The same under faults, through the proxy.
case $BACKEND in
  # Clients are pooled (a few connections carry all chunks), so the reset is aimed at requests:
  # right after 1 complete() in 20 (1 file in 20) went out, as in seed 001.
  hdfs) FAULTS=(--reset-on complete 0.05 --silence-on complete 0.02 --reset-on addBlock 0.02 --silence-on rename2 0.02)
        WHAT="NameNode: RST after 5% of complete(), 2% of addBlock; no reply to 2% of complete(), rename2" ;;
  s3) FAULTS=(--hang 0.10 --reset 0.05 --reset-within 1048576 --reset-any-byte --trickle 0.05)
      WHAT="new connections: 10% hung, 5% RST at any byte, 5% trickling" ;;
esac
coproc PROXY { "$BIN/faultproxy" "$TARGET" "${FAULTS[@]}" --seed 7 --stats "$DIR/proxy.json"; }
PROXY_PID=$PROXY_PID
read -r _ PADDR <&"${PROXY[0]}"
injected() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sum(v for k, v in d.items() if k != "connections"))' "$DIR/proxy.json"; }
sleep 0.3
BEFORE=$(injected)
for r in $(seq 1 "$REPEAT"); do
  run_copy "ferry-copy, $WHAT" "faults-$r" "$PADDR"
  sleep 0.3
  NOW=$(injected)
  echo "  faults injected in this run: $((NOW - BEFORE)) ($(cat "$DIR/proxy.json"))"
  BEFORE=$NOW
  sqlite3 "$DIR/ledger.db" "SELECT '  attempts redone: ' || COUNT(*) || ' on ' || COUNT(DISTINCT chunk_id) || ' chunks' FROM attempts WHERE stage = 'copy' AND outcome <> 'done'"
  sqlite3 "$DIR/ledger.db" "SELECT '  bytes redone: ' || COALESCE(SUM(redone_bytes), 0) || ' (a chunk averages ' || (SELECT CAST(AVG(b) AS INTEGER) FROM (SELECT SUM(bytes) b FROM parts GROUP BY chunk_id)) || ' bytes)' FROM attempts WHERE stage = 'copy'"
  echo "  parts sent again inside an attempt: $(grep -c "part copy failed; sending it again" "$DIR/copy.log" || true); ambiguous closes settled in place: $(grep -c "ambiguous close settled" "$DIR/copy.log" || true)"
  echo "  hedges started: $(grep -c "starting a hedged upload" "$DIR/copy.log" || true), won: $(grep -c "the hedged upload won" "$DIR/copy.log" || true)"
done
