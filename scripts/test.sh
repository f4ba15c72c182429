#!/usr/bin/env bash
# Runs every Ferry test on a fresh machine: installs and starts PostgreSQL (and the other
# real servers the tests use), then `cargo test --workspace`. A missing server fails a test;
# nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
trap ferry_stop_postgres EXIT
ferry_start_postgres
ferry_python_deps
cargo build --workspace --bins
cargo test --workspace -- --test-threads="${FERRY_TEST_THREADS:-4}" "$@"
