#!/usr/bin/env bash
# Benchmark (not a test): the three clocks a user meets first, measured on this build and printed
# side by side with the previous build's figures (the newest bench/results/summary-*.md, or
# PREVIOUS=<file>); the new table is written to bench/results/summary-<date>.md.
#
# 1. Fresh clone to first result: `git clone` of HEAD, then scripts/demo.sh with an empty cargo
#    target dir (crates and Python packages already downloaded): wall and CPU time to the demo's
#    table. Then the rebuild of the release binaries after a change in one stage's crate.
# 2. The HDFS path: bench/compare.sh's HDFS rows (the four stages over two MiniDFS clusters,
#    100 chunks x ~5 partitions, 1.7M events), next to its local four-stage row on the same run.
# 3. Landing to published under `--watch`: bench/latency.sh on local dirs and on two MiniDFS
#    clusters (capacity, p50/p99 at 25/50/75% of it, CPU at idle).
#
#   bench/summary.sh [DIR]   (default /tmp/ferry-summary; takes ~40 min on 2 cores)
#   env: PREVIOUS=<summary file>, SKIP="demo hdfs latency latency_hdfs" (any of them: keep the
#        previous figures for that part, marked as not measured), DURATION=90 (latency.sh's
#        seconds per load)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
. scripts/services.sh
DIR=${1:-/tmp/ferry-summary}
SKIP=" ${SKIP:-} "
rm -rf "$DIR" && mkdir -p "$DIR"
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+changes"
stamp=$(date -u +%Y-%m-%d-%H%M)
PREVIOUS=${PREVIOUS:-$(ls bench/results/summary-*.md 2>/dev/null | sort | tail -1)}
VALUES=$DIR/values
: > "$VALUES"
put() { echo "$1=$2" >> "$VALUES"; }
# prev KEY: the previous summary's value of KEY (empty if none)
prev() { [ -n "$PREVIOUS" ] && sed -n "s/^$1=//p" "$PREVIOUS" | tail -1 || true; }
skipped() { [[ "$SKIP" == *" $1 "* ]]; }
carry() { for k in "$@"; do v=$(prev "$k"); [ -n "$v" ] && put "$k" "$v"; put "${k}_carried" 1; done; }

# 1. Fresh clone to the demo's table, then a release rebuild after touching one stage's crate.
if skipped demo; then
  carry demo_wall_s demo_cpu_s rebuild_s
else
  git clone -q "$ROOT" "$DIR/clone"
  (cd "$DIR/clone" && CARGO_TARGET_DIR=$DIR/target /usr/bin/time -f "%e %U %S" -o "$DIR/demo.time" \
    scripts/demo.sh "$DIR/demo" > "$DIR/demo.log" 2>&1) || { tail -20 "$DIR/demo.log" >&2; exit 1; }
  grep -q "rows" "$DIR/demo.log" || { echo "summary: the demo printed no table" >&2; tail -20 "$DIR/demo.log" >&2; exit 1; }
  read -r wall user sys < "$DIR/demo.time"
  put demo_wall_s "$wall"; put demo_cpu_s "$(echo "$user + $sys" | bc -l)"
  rm -rf "$DIR/target" "$DIR/clone"
fi
# The release binaries every later part runs, built before the rebuild is timed.
ferry_release_bins -p ferry-bench -p ferry-tests
if ! skipped demo; then
  # A change in one stage's crate: its source file's mtime moves, so cargo rebuilds that crate
  # and relinks its binary (and nothing else).
  # The same packages as above: another set would unify other features and rebuild more.
  touch copy/src/lib.rs
  start=$(date +%s.%N)
  ferry_release_bins -p ferry-bench -p ferry-tests
  put rebuild_s "$(echo "$(date +%s.%N) - $start" | bc -l | xargs printf '%.1f')"
fi

# 2. The HDFS path, in one compare.sh run (its local row on the same run, as a yardstick).
if skipped hdfs; then
  carry local_rps hdfs_rps hdfs_s hdfs_extract_s hdfs_transform_s hdfs_copy_s hdfs_load_s hdfs_copy_calls
else
  ROUNDS=1 FORMATS=avro POLARS=0 SPARK=0 S3=0 HDFS=1 DIR=$DIR/compare bench/compare.sh > "$DIR/compare.log" 2>&1 \
    || { tail -30 "$DIR/compare.log" >&2; exit 1; }
  table=$(ls -t bench/results/compare-1700000-*.md | head -1)
  cp "$table" "$DIR/compare.md"
  # The local and the HDFS "four stages one after the other" rows, in that order.
  mapfile -t four < <(grep '^| ferry, four stages one after the other |' "$table")
  [ "${#four[@]}" = 2 ] || { echo "summary: $table has no local and HDFS pipeline rows" >&2; exit 1; }
  field() { echo "$1" | awk -F'|' -v n="$2" '{print $n}' | sed 's/^ *//; s/ .*//; s/,//g'; }
  put local_rps "$(field "${four[0]}" 4)"
  put hdfs_s "$(field "${four[1]}" 3)"
  put hdfs_rps "$(field "${four[1]}" 4)"
  # Per stage, from the table of limits: the "measured" column of the HDFS stages.
  limit() { grep "^| $1 " "$table" | awk -F'|' '{print $5}' | sed 's/^ *//; s/ s *$//'; }
  put hdfs_extract_s "$(limit 'ferry-extract to cluster B')"
  put hdfs_transform_s "$(limit 'ferry-transform from cluster B')"
  put hdfs_copy_s "$(limit 'ferry-copy to cluster A')"
  put hdfs_load_s "$(limit 'ferry-load on cluster A')"
  put hdfs_copy_calls "$(grep '^| ferry-copy to cluster A ' "$table" | grep -o '[0-9,]* client calls' | tr -d , | cut -d' ' -f1)"
  # compare.sh wrote its table to bench/results; this run keeps it with the summary instead.
  git ls-files --error-unmatch "$table" >/dev/null 2>&1 || rm -f "$table"
fi

# 3. Landing to published, local and on HDFS.
latency() { # latency NAME [env...]: runs latency.sh, puts NAME_capacity, NAME_p50_25 ... NAME_idle
  local name=$1; shift
  env "$@" BIN="$BIN" OUT="$DIR/$name.md" DURATION="${DURATION:-90}" bench/latency.sh "$DIR/$name" > "$DIR/$name.log" 2>&1 \
    || { tail -30 "$DIR/$name.log" >&2; exit 1; }
  put "${name}_capacity" "$(grep -o 'capacity: .*' "$DIR/$name.md" | grep -o '[0-9.]* files/s' | head -1 | cut -d' ' -f1)"
  for load in 25 50 75; do
    row=$(grep "^| $load% |" "$DIR/$name.md")
    put "${name}_p50_$load" "$(echo "$row" | awk -F'|' '{print $5}' | sed 's/ s *$//; s/^ *//')"
    put "${name}_p99_$load" "$(echo "$row" | awk -F'|' '{print $7}' | sed 's/ s *$//; s/^ *//')"
  done
  put "${name}_idle" "$(grep -o '[0-9.]*% of one core in all' "$DIR/$name.md" | cut -d% -f1)"
  # Its files (~30 GB locally: every landed file, staged chunk and table file) go once read.
  rm -rf "${DIR:?}/$name"
}
keys() { local n=$1; echo "${n}_capacity ${n}_p50_25 ${n}_p99_25 ${n}_p50_50 ${n}_p99_50 ${n}_p50_75 ${n}_p99_75 ${n}_idle"; }
# shellcheck disable=SC2046
if skipped latency; then carry $(keys latency); else latency latency; fi
# shellcheck disable=SC2046
if skipped latency_hdfs; then carry $(keys latency_hdfs); else latency latency_hdfs HDFS=1; fi

# The table: each figure next to the previous summary's.
now() { sed -n "s/^$1=//p" "$VALUES" | tail -1; }
OUTFILE=bench/results/summary-$stamp.md
{
  echo "# bench/summary.sh ($stamp UTC, $commit, $(nproc) cores)"
  echo
  echo "Previous: ${PREVIOUS:-none} ($(sed -n 's/^commit=//p' "${PREVIOUS:-/dev/null}" 2>/dev/null || true))."
  echo "A figure marked * was not measured in this run (SKIP) and is the previous one."
  echo
  echo "| clock | what | previous | this build | this / previous |"
  echo "|---|---|---|---|---|"
  row() { # row CLOCK KEY LABEL UNIT
    local p n ratio mark=""
    p=$(prev "$2"); n=$(now "$2")
    [ "$(now "${2}_carried")" = 1 ] && mark="*"
    ratio=""; [ -n "$p" ] && [ -n "$n" ] && [ "$p" != 0 ] && ratio=$(echo "$n / $p" | bc -l | xargs printf '%.2fx')
    echo "| $1 | $3 | ${p:--}${p:+ $4} | ${n:--}${n:+ $4}$mark | $ratio |"
  }
  row "fresh clone" demo_wall_s "to the demo's table (crates cached), wall" s
  row "fresh clone" demo_cpu_s "to the demo's table, CPU" s
  row "fresh clone" rebuild_s "release rebuild after a change in ferry-copy" s
  row "HDFS path" hdfs_rps "four stages over two MiniDFS clusters" "records/s"
  row "HDFS path" local_rps "the same four stages on local dirs, same run" "records/s"
  row "HDFS path" hdfs_extract_s "extract to cluster B" s
  row "HDFS path" hdfs_transform_s "transform from cluster B" s
  row "HDFS path" hdfs_copy_s "copy to cluster A" s
  row "HDFS path" hdfs_load_s "load on cluster A" s
  row "HDFS path" hdfs_copy_calls "copy's NameNode calls" ""
  for name in latency latency_hdfs; do
    where=$([ $name = latency ] && echo "local" || echo "HDFS")
    row "landing to published, $where" "${name}_capacity" "capacity" "files/s"
    for load in 25 50 75; do
      row "landing to published, $where" "${name}_p50_$load" "p50 at $load%" s
      row "landing to published, $where" "${name}_p99_$load" "p99 at $load%" s
    done
    row "landing to published, $where" "${name}_idle" "idle: CPU of the four services" "% of a core"
  done
  echo
  echo "The figures, read by the next run:"
  echo
  echo '```'
  echo "commit=$commit"
  grep -v '_carried=' "$VALUES"
  echo '```'
  for part in compare latency latency_hdfs; do
    [ -f "$DIR/$part.md" ] || continue
    echo
    echo "## This run's $part table"
    echo
    sed 's/^# /### /' "$DIR/$part.md"
  done
} > "$OUTFILE"
cat "$OUTFILE"
