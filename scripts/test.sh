#!/usr/bin/env bash
# Runs every Ferry test on a fresh machine: installs and starts PostgreSQL (and the other
# real servers the tests use), then `cargo test --workspace`. A missing server fails a test;
# nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
. scripts/minidfs.sh
. scripts/s3.sh
trap 'ferry_stop_s3; ferry_stop_postgres' EXIT
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
cargo build --workspace --bins
cargo test --workspace -- --test-threads="${FERRY_TEST_THREADS:-4}" "$@"
