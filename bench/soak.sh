#!/usr/bin/env bash
# The soak (bench/soak.py): the four stages for a set time under a steady stream of files and
# a schedule of faults, sampled every minute, with a verdict at the end (exit 0 = pass).
#
#   bench/soak.sh                          # an hour, local dirs + SQLite, --watch services
#   bench/soak.sh --setup s3 --minutes 60  # the table on S3 behind a fault proxy, Postgres ledger
#   bench/soak.sh --setup hdfs             # staging on MiniDFS B, the table on MiniDFS A (its
#                                          # NameNode behind the fault proxy), Postgres ledger
#   bench/soak.sh --mode once              # --once runs from a timer loop, as cron runs them
#   env: BIN=DIR (Ferry's binaries; default: a release build), OUT=DIR (default
#        bench/results/soak-<setup>-<mode>-<date>)
# Any other option goes to bench/soak.py (--rate, --quiet, --gc-every, --prune-every, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
. scripts/s3.sh
setup=local mode=watch
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --setup) setup=${args[i + 1]} ;;
    --mode) mode=${args[i + 1]} ;;
  esac
done
# A run too short for its options is refused now, not after the build.
python3 bench/soak.py --check "$@"
ferry_python_deps
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib >&2
ferry_apt prometheus prometheus
if [ -z "${BIN:-}" ]; then
  ferry_release_bins -p ferry-bench -p ferry-tests
fi
case "$setup" in
  s3)
    trap 'ferry_stop_s3; ferry_stop_postgres' EXIT
    ferry_start_postgres
    ferry_start_s3
    ;;
  hdfs)
    . scripts/minidfs.sh
    trap 'ferry_stop_minidfs; ferry_stop_postgres' EXIT
    ferry_start_postgres
    ferry_start_minidfs A
    ferry_start_minidfs B
    ;;
esac
OUT=${OUT:-bench/results/soak-$setup-$mode-$(date +%Y%m%d-%H%M)}
python3 bench/soak.py --bin "$BIN" --repo "$PWD" --out "$OUT" "$@"
