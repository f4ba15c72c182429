#!/usr/bin/env bash
# Benchmark (not a test): ferry-copy's peak RSS and wall time moving bench/compare.sh's HDFS spool
# (EVENTS sample events in FILES files, each spread over ~4 days: one chunk of ~5 partitions per
# file) from local disk to a MiniDFS cluster, once per configuration variant given, each run twice.
#
#   bench/copy_memory.sh [VARIANT]...   a variant is environment assignments, e.g.
#                                       "FERRY_COPY_BYTES_IN_FLIGHT=32MiB" or
#                                       "FERRY_COPY_BYTES_IN_FLIGHT=1024GiB FERRY_COPY_HEDGE_MULTIPLE=0";
#                                       none: the defaults, then no byte budget
#   env: EVENTS=1700000, FILES=100 (FILES=10: files ~10x larger), DIR=/tmp/ferry-copy-memory
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh; . scripts/minidfs.sh
ferry_release_bins
EVENTS=${EVENTS:-1700000}; FILES=${FILES:-100}; D=${DIR:-/tmp/ferry-copy-memory}
[ $# -gt 0 ] || set -- "DEFAULTS=1" "FERRY_COPY_BYTES_IN_FLIGHT=1024GiB"
trap 'ferry_stop_minidfs 2>/dev/null || true; rm -rf "$D"' EXIT
rm -rf "$D"; mkdir -p "$D"
"$BIN/ferry" gen --format avro --codec null --payload words --out "$D/in" --files "$FILES" \
  --records $((EVENTS / FILES)) --block-records 4000 --gap-ms $((4 * 86400000 * FILES / EVENTS)) >/dev/null
ferry_local_config "$D" > "$D/ferry.toml"
FERRY_CONFIG=$D/ferry.toml "$BIN/ferry-extract" --once >/dev/null 2>&1
FERRY_CONFIG=$D/ferry.toml "$BIN/ferry-transform" --once >/dev/null 2>&1
sqlite3 "$D/ledger.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
cp -al "$D/spool" "$D/spool.orig"; cp "$D/ledger.db" "$D/ledger.orig"
echo "spool: $(du -sb "$D/spool.orig" | cut -f1) bytes in $(find "$D/spool.orig" -name '*.parquet' | wc -l) files," \
  "$(sqlite3 "$D/ledger.orig" 'SELECT COUNT(*) FROM chunks') chunks ($EVENTS events in $FILES files)"
ferry_build_minidfs >/dev/null
ferry_start_minidfs A >/dev/null
echo "| variant | wall | peak RSS | CPU | hedges started | chunks not done |"
echo "|---|---|---|---|---|---|"
r=0
for variant in "$@"; do
  for _ in 1 2; do
    r=$((r + 1))
    rm -rf "$D/spool" "$D"/ledger.db*; cp -al "$D/spool.orig" "$D/spool"; cp "$D/ledger.orig" "$D/ledger.db"
    sed "s#^url = \"$D/warehouse\"#url = \"$FERRY_TEST_HDFS_A/copy$r\"#" "$D/ferry.toml" > "$D/copy.toml"
    # shellcheck disable=SC2086
    env $variant FERRY_CONFIG="$D/copy.toml" RUST_LOG=info /usr/bin/time -f "%e %M %U %S" -o "$D/t" \
      "$BIN/ferry-copy" --once > "$D/copy.log" 2>&1 || tail -3 "$D/copy.log"
    read -r s k u y < <(tail -1 "$D/t")
    printf '| %s | %.2f s | %d MiB | %.1f s | %s | %s |\n' "$variant" "$s" $((k / 1024)) "$(echo "$u + $y" | bc)" \
      "$(grep -c 'starting a hedged upload' "$D/copy.log" || true)" \
      "$(sqlite3 "$D/ledger.db" "SELECT COUNT(*) FROM tasks WHERE stage = 'copy' AND state <> 'done'")"
  done
done
