#!/usr/bin/env bash
# The randomized model test of exactly once (tests/tests/model.rs), for as long as asked:
# random histories of arrivals, corrections, reverts, duplicates, kill -9, reruns, skips, gc, prune
# and (on Postgres) ledger restarts, each checked against the model, on five setups: SQLite,
# Postgres, the table on S3 through faults, staging and table on two MiniDFS clusters
# (hdfs_pair; the suite walks one seed of it), and a Delta table on local dirs (delta). Prints every seed, the
# steps run and, on a failure, the seed, the history and the shortest failing prefix.
#
#   bench/model.sh                 # an hour on each setup, one after the other
#   MINUTES=10 STEPS=500 SETUPS="postgres s3_through_faults" bench/model.sh
#   PARALLEL=1 bench/model.sh      # the five side by side, an hour each
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
. scripts/s3.sh
. scripts/minidfs.sh
# The Postgres variant starts a server of its own (it restarts it): only the programs are needed.
ferry_apt initdb postgresql
ferry_python_deps
# The HDFS pair: each run starts two MiniDFS clusters (Hadoop's, from Maven Central).
ferry_build_minidfs >&2
# The S3 variant: the test S3 server (its own fault proxy in front of it).
trap ferry_stop_s3 EXIT
ferry_start_s3
cargo build --workspace --bins >&2
cargo test -p ferry-tests --test model --no-run >&2
export FERRY_MODEL_MINUTES=${MINUTES:-60} FERRY_MODEL_STEPS=${STEPS:-400}
one() {
  local t=random_histories_keep_every_file_exactly_once_on_$1
  echo "== $t for $FERRY_MODEL_MINUTES min, $FERRY_MODEL_STEPS steps a seed" >&2
  # The whole output (a failure's history and shortest failing prefix) goes to the log.
  local log=${TMPDIR:-/tmp}/ferry-model-$t.log
  echo "   (the whole output: $log)" >&2
  cargo test -p ferry-tests --test model -- --exact "$t" --include-ignored --nocapture 2>&1 | tee "$log" | grep -E '^model:|panicked|failed|test result' >&2
}
# PARALLEL=1 runs the setups side by side (each gets the whole time; they share the cores).
pids=()
for s in ${SETUPS:-sqlite postgres s3_through_faults hdfs_pair delta iceberg}; do
  if [ "${PARALLEL:-0}" = 1 ]; then
    one "$s" & pids+=($!)
  else
    one "$s" || failed=1
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
exit "${failed:-0}"
