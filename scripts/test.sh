#!/usr/bin/env bash
# Runs every Ferry test on a fresh machine: installs and starts PostgreSQL (and the other
# real servers the tests use), fetches what the tests need (Spark's jars, Hadoop for MiniDFS)
# before any test starts, then runs every test binary (scripts/run_tests.py). A missing server
# fails a test; nothing is skipped.
#
#   scripts/test.sh            every test (what CI runs)
#   scripts/test.sh --quick    the unit tests and the integration binaries on SQLite and local
#                              dirs (PostgreSQL for the ledger's own tests; no HDFS, S3, GCS,
#                              Azure or Spark): a few minutes, before each commit
#   scripts/test.sh FILTER...  one plain `cargo test` run with every service up (cargo picks what
#                              matches)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
. scripts/services.sh
. scripts/minidfs.sh
. scripts/s3.sh
. scripts/emulators/gcs.sh
. scripts/emulators/azurite.sh
trap 'ferry_stop_azurite; ferry_stop_gcs; ferry_stop_s3; ferry_stop_postgres' EXIT
ferry_start_postgres
ferry_python_deps
ferry_deploy_tools
# Spark 4.1 with Iceberg's runtime: the quick tier's Iceberg tests read their tables with it too.
ferry_iceberg_spark
# The quick tier: binaries that need no server but PostgreSQL (kept in step with the full run:
# run_tests.py refuses a name it does not find).
quick_tier=(ferry-tests::cases ferry-tests::deploy ferry-tests::inputs ferry-tests::moving_sources
  ferry-tests::durability ferry-tests::docs ferry-tests::archive_memory ferry-tests::hostile ferry-tests::operations
  ferry-tests::pipeline ferry-tests::versions ferry-tests::versions_delta ferry-tests::versions_iceberg ferry-tests::iceberg
  ferry-tests::recovery ferry-tests::observe
  ferry-ledger::conformance ferry-ledger::resilience ferry-ledger::schema ferry-runtime::runner
  ferry-admin::ferry_cli ferry-admin::ferry_gen_and_config ferry-transform::fuzz ferry-transform::avro_decoder)
if [ -z "$quick" ]; then
  # Spark reads Delta tables in some tests: its jars fetched now, once (no network while tests run).
  ferry_spark_jars
  # Kerberos: MIT's GSSAPI library (hdfs-native loads it), kinit for a credential cache renewed
  # by someone else (as a cron job would), and libfaketime for the clock-skew test.
  ferry_apt kinit krb5-user libgssapi-krb5-2
  ferry_apt faketime faketime
  # HDFS: our MiniDFS program (Hadoop from Maven Central); each test starts its own clusters.
  ferry_build_minidfs
  # Iceberg's REST catalog test server (Iceberg's test fixtures from Maven Central); each test
  # starts its own.
  ferry_build_iceberg_rest
  # S3: versitygw (Go module proxy) over TLS with a CA made here; exports FERRY_TEST_S3_*.
  ferry_start_s3
  # An S3-compatible server that ignores If-None-Match (moto's, from PyPI): doctor must refuse it
  # for a Delta table.
  ferry_install_overwriting_s3
  # GCS and Azure: their emulators over TLS (ferry-gcs built from the Go module proxy, Azurite
  # from npm); export FERRY_TEST_GCS_* and FERRY_TEST_AZURE_*.
  ferry_start_gcs
  ferry_start_azurite
fi
cargo build --workspace --bins
threads=(--test-threads="${FERRY_TEST_THREADS:-4}")
if [ $# -gt 0 ] && [ -z "$quick" ]; then
  # A filter or harness flag: one plain run (cargo picks what matches).
  cargo test --workspace -- "${threads[@]}" "$@"
  exit
fi
# Every test binary, a few at a time (scripts/run_tests.py: most of them wait on JVMs, leases and
# outages more than they compute), longest first by the times of earlier runs on this machine; each
# one runs even after another fails, and each one's time is printed at the end and kept in
# $FERRY_CACHE/test-times.tsv. The outage tests (a ten-minute outage, mostly asleep) run beside the
# others, not in one of their slots.
# Each binary's output of the last run is kept in $FERRY_CACHE/test-logs (a green run's too:
# a binary that took far longer than its history says why there).
run_log=$(mktemp -d)
keep_logs() {
  rm -rf "$FERRY_CACHE/test-logs" && mv "$run_log" "$FERRY_CACHE/test-logs" 2>/dev/null || rm -rf "$run_log"
}
trap 'ferry_stop_azurite; ferry_stop_gcs; ferry_stop_s3; ferry_stop_postgres; keep_logs' EXIT
cargo test --locked --workspace --no-run --message-format=json |
  python3 scripts/run_tests.py --jobs "${FERRY_TEST_JOBS:-3}" --threads "${FERRY_TEST_THREADS:-4}" \
    --history "$FERRY_CACHE/test-times.tsv" --known bench/results/ci-times.md --log-dir "$run_log" --beside ferry-tests::outage \
    ${quick:+$(printf -- '--only %s ' "${quick_tier[@]}")}
