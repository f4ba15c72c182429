#!/usr/bin/env bash
# Runs every Ferry test on a fresh machine: installs and starts PostgreSQL (and the other
# real servers the tests use), then `cargo test --workspace`. A missing server fails a test;
# nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
. scripts/minidfs.sh
. scripts/s3.sh
. scripts/emulators/gcs.sh
. scripts/emulators/azurite.sh
trap 'ferry_stop_azurite; ferry_stop_gcs; ferry_stop_s3; ferry_stop_postgres' EXIT
ferry_start_postgres
ferry_python_deps
ferry_deploy_tools
# Kerberos: MIT's GSSAPI library (hdfs-native loads it), kinit for a credential cache renewed
# by someone else (as a cron job would), and libfaketime for the clock-skew test.
ferry_apt kinit krb5-user libgssapi-krb5-2
ferry_apt faketime faketime
# HDFS: our MiniDFS program (Hadoop from Maven Central); each test starts its own clusters.
ferry_build_minidfs
# S3: versitygw (Go module proxy) over TLS with a CA made here; exports FERRY_TEST_S3_*.
ferry_start_s3
# GCS and Azure: their emulators over TLS (ferry-gcs built from the Go module proxy, Azurite
# from npm); export FERRY_TEST_GCS_* and FERRY_TEST_AZURE_*.
ferry_start_gcs
ferry_start_azurite
cargo build --workspace --bins
threads=(--test-threads="${FERRY_TEST_THREADS:-4}")
if [ $# -gt 0 ]; then
  # A filter or harness flag: one plain run (cargo picks what matches).
  cargo test --workspace -- "${threads[@]}" "$@"
  exit
fi
# Every test binary runs even after one fails (--no-fail-fast): a red run names all it found.
# The outage tests spend most of their time (a ten-minute outage) asleep while the services
# wait it out: they run beside the other tests instead of after them.
outage_exe=$(cargo test --locked -p ferry-tests --test outage --no-run --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "outage" and m.get("executable"):
        print(m["executable"])')
outage_log=$(mktemp)
trap 'ferry_stop_azurite; ferry_stop_gcs; ferry_stop_s3; ferry_stop_postgres; rm -f "$outage_log"' EXIT
(cd tests && exec "$outage_exe" "${threads[@]}") >"$outage_log" 2>&1 &
outage_pid=$!
others=()
for f in tests/tests/*.rs; do
  name=$(basename "$f" .rs)
  [ "$name" = outage ] || others+=(--test "$name")
done
status=0
cargo test --no-fail-fast --workspace --exclude ferry-tests -- "${threads[@]}" || status=1
cargo test --no-fail-fast -p ferry-tests --lib --bins "${others[@]}" -- "${threads[@]}" || status=1
wait "$outage_pid" || status=1
echo "--- the outage tests (run beside the others)"
cat "$outage_log"
exit $status
