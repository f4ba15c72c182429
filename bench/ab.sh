#!/usr/bin/env bash
# Benchmark (not a test): two builds of Ferry on the same data, stage by stage, to tell a
# change's cost from noise. For each source format, the stages of build A and build B (extract,
# transform, copy, load on local dirs) run ROUNDS times each, alternating (A, B, A, B, ...),
# each round from the same starting state; the medians are printed side by side with B's over
# A's, and whether both published the same Parquet files byte for byte (transform's output is a
# function of its input, and copy and load move it unchanged).
#   bench/ab.sh A_BIN_DIR B_BIN_DIR [DIR]
#   A_BIN_DIR, B_BIN_DIR: directories holding ferry and the stages' binaries (release
#   builds: e.g. `git worktree add /tmp/a <commit>` and `cargo build --release` there, then
#   copy the binaries out of the target dir)
#   env: FORMATS="avro jsonl csv", FILES=8, RECORDS=60000 (per file), ROUNDS=5,
#        CHUNK=8MiB (extract.chunk_size), STAGES="extract transform copy load" (a prefix of the
#        four: the stages timed)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
A=$(realpath "$1"); B=$(realpath "$2"); DIR=${3:-/tmp/ferry-ab}
FORMATS=${FORMATS:-avro jsonl csv}; STAGES=${STAGES:-extract transform copy load}; FILES=${FILES:-8}; RECORDS=${RECORDS:-60000}; ROUNDS=${ROUNDS:-5}; CHUNK=${CHUNK:-8MiB}
for bin in "$A" "$B"; do
  for b in ferry $(for s in $STAGES; do echo "ferry-$s"; done); do
    [ -x "$bin/$b" ] || { echo "no $bin/$b" >&2; exit 2; }
  done
done
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# run NAME CMD...: appends "wall cpu peak_kib" of CMD to $DIR/NAME
run() {
  local name=$1; shift
  /usr/bin/time -f "%e %U %S %M" -o "$DIR/t" "$@" >"$DIR/log" 2>&1 || { cat "$DIR/log" >&2; exit 1; }
  read -r wall user sys kib < "$DIR/t"
  echo "$wall $(echo "$user + $sys" | bc -l) $kib" >> "$DIR/$name"
}
# fresh FORMAT: an empty ledger, staging and spool under $DIR/$FORMAT
fresh() {
  local d=$DIR/$1
  rm -rf "$d/ledger.db" "$d/ledger.db-wal" "$d/ledger.db-shm" "$d/staging" "$d/spool" "$d/warehouse"
}
printf '%-6s %-10s %10s %10s %8s %10s %10s %8s %8s %8s\n' format stage "A wall" "B wall" "B/A" "A cpu" "B cpu" "B/A" "A MiB" "B MiB"
for fmt in $FORMATS; do
  d=$DIR/$fmt
  rm -rf "$d" && mkdir -p "$d"
  "$A/ferry" gen --format "$fmt" --codec deflate --out "$d/in" --files "$FILES" --records "$RECORDS" >/dev/null
  ferry_local_config "$d" "$fmt" "$CHUNK" > "$d/ferry.toml"
  export FERRY_CONFIG=$d/ferry.toml
  for r in $(seq "$ROUNDS"); do
    for side in A B; do
      bin=$A; [ "$side" = B ] && bin=$B
      # each stage from what the one before it left, starting from nothing
      fresh "$fmt"
      for stage in $STAGES; do
        run "$fmt.$stage.$side" "$bin/ferry-$stage" --once
      done
      # what the last stage left, by name and content: the two builds must write the same bytes
      out=$d/spool; [[ " $STAGES " == *" load "* ]] && out=$d/warehouse
      (cd "$out" && find . -name '*.parquet' -type f | sort | xargs -r sha256sum) > "$DIR/$fmt.out.$side"
    done
  done
  for stage in $STAGES; do
    col() { cut -d' ' -f"$2" "$DIR/$fmt.$stage.$1" | median; }
    aw=$(col A 1); bw=$(col B 1); ac=$(col A 2); bc_=$(col B 2); am=$(col A 3); bm=$(col B 3)
    printf '%-6s %-10s %9.2fs %9.2fs %8.3f %9.2fs %9.2fs %8.3f %8d %8d\n' "$fmt" "$stage" "$aw" "$bw" \
      "$(echo "$bw / $aw" | bc -l)" "$ac" "$bc_" "$(echo "$bc_ / $ac" | bc -l)" $((am / 1024)) $((bm / 1024))
  done
  same="the same Parquet files, byte for byte"
  cmp -s "$DIR/$fmt.out.A" "$DIR/$fmt.out.B" || same="DIFFERENT Parquet output (diff $DIR/$fmt.out.A $DIR/$fmt.out.B)"
  echo "  $fmt: $FILES files x $RECORDS records, $(du -sb "$d/in" | cut -f1) bytes; medians of $ROUNDS rounds each, alternating; A and B left $same ($(wc -l < "$DIR/$fmt.out.A") files)"
done
