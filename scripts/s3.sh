#!/usr/bin/env bash
# A real S3-compatible server for Ferry's tests and benchmarks: Versity S3 Gateway (versitygw)
# with its posix backend, serving HTTPS itself on 127.0.0.1 with a certificate signed by a
# throwaway CA made here, so TLS handshakes are real. See scripts/S3_SERVER.md.
#
# Source it:   . scripts/s3.sh; trap ferry_stop_s3 EXIT; ferry_start_s3   (start also installs)
# Exports:     FERRY_TEST_S3_ENDPOINT (https://127.0.0.1:PORT), FERRY_TEST_S3_BUCKET (ferry),
#              FERRY_TEST_S3_CA (PEM of the CA), FERRY_TEST_S3_ACCESS_KEY/_SECRET_KEY,
#              FERRY_TEST_S3_DATA (the posix backend's directory), FERRY_TEST_S3_BIN, and the
#              same as AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION=us-east-1.
# Options:     FERRY_S3_ARGS (default --keep-alive) replaces versitygw's extra global flags;
#              FERRY_S3_PORT picks the port; FERRY_CACHE (default ~/.cache/ferry) holds the binary.
# rclone:      ferry_rclone_s3_env; rclone copy --checksum DIR ferrys3:ferry/PREFIX

. "$(dirname "${BASH_SOURCE[0]}")/tls.sh"

FERRY_CACHE=${FERRY_CACHE:-$HOME/.cache/ferry}
mkdir -p "$FERRY_CACHE"

# Pinned: the version whose behaviour scripts/S3_SERVER.md describes.
FERRY_VERSITYGW_VERSION=${FERRY_VERSITYGW_VERSION:-v1.8.0}
FERRY_VERSITYGW=$FERRY_CACHE/bin/versitygw

# Installs versitygw (built from the Go module proxy, ~2 min on a fresh machine; instant when
# the pinned version is already there) and rclone from Debian if missing.
ferry_install_s3() {
  command -v go >/dev/null 2>&1 || PATH=$PATH:/usr/local/go/bin
  if ! { [ -x "$FERRY_VERSITYGW" ] &&
         go version -m "$FERRY_VERSITYGW" 2>/dev/null | grep -q "mod[[:space:]]*github.com/versity/versitygw[[:space:]]*$FERRY_VERSITYGW_VERSION[[:space:]]"; }; then
    echo "installing versitygw $FERRY_VERSITYGW_VERSION from the Go module proxy" >&2
    mkdir -p "$FERRY_CACHE/bin"
    GOBIN=$FERRY_CACHE/bin GOFLAGS=-buildvcs=false \
      go install "github.com/versity/versitygw/cmd/versitygw@$FERRY_VERSITYGW_VERSION" >&2 || return 1
  fi
  if ! command -v rclone >/dev/null 2>&1; then
    echo "installing rclone from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone) >&2 || return 1
  fi
}

# An S3-compatible server that ignores If-None-Match (a second create replaces the first), for
# the test that `ferry doctor` refuses a Delta destination on such a store: moto's server 5.0.0
# (later releases honour the header), in its own virtual environment under $FERRY_CACHE.
# Exports FERRY_TEST_MOTO_SERVER (its moto_server); each test starts its own.
FERRY_MOTO_VERSION=5.0.0
ferry_install_overwriting_s3() {
  local venv=$FERRY_CACHE/moto-$FERRY_MOTO_VERSION
  # .installed is written last: a cut-off install is redone, not trusted.
  if [ ! -f "$venv/.installed" ]; then
    echo "installing moto[server] $FERRY_MOTO_VERSION from PyPI into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2 && "$venv/bin/python3" -m pip install -q "moto[server]==$FERRY_MOTO_VERSION" >&2 &&
      touch "$venv/.installed" || return 1
  fi
  export FERRY_TEST_MOTO_SERVER=$venv/bin/moto_server
}

# Signed S3 request with curl (SigV4): ferry_s3_curl METHOD PATH [curl args...]
ferry_s3_curl() {
  local method=$1 path=$2; shift 2
  curl -sS --cacert "$FERRY_TEST_S3_CA" --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
    --user "$FERRY_TEST_S3_ACCESS_KEY:$FERRY_TEST_S3_SECRET_KEY" \
    -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" -X "$method" "$@" "$FERRY_TEST_S3_ENDPOINT$path"
}

# Starts versitygw over HTTPS on 127.0.0.1:<free port> with data in a temp dir, creates the
# bucket, exports the variables above. Stopped by ferry_stop_s3 (the caller traps EXIT).
ferry_start_s3() {
  ferry_start_on_free_port FERRY_S3_PORT ferry_start_s3_try ferry_stop_s3
}

ferry_start_s3_try() {
  ferry_install_s3 || return 1
  FERRY_S3_DIR=$(mktemp -d /tmp/ferry-s3.XXXXXX)
  mkdir -p "$FERRY_S3_DIR/tls" "$FERRY_S3_DIR/data"
  ferry_make_certs "$FERRY_S3_DIR/tls" || { echo "ferry_start_s3: openssl failed" >&2; return 1; }
  FERRY_S3_PORT=${FERRY_S3_PORT:-$(ferry_free_port)}
  export FERRY_S3_DIR FERRY_S3_PORT
  export FERRY_TEST_S3_ENDPOINT="https://127.0.0.1:$FERRY_S3_PORT"
  export FERRY_TEST_S3_BUCKET=ferry
  export FERRY_TEST_S3_CA=$FERRY_S3_DIR/tls/ca.pem
  # The posix backend's directory: a test may make one of its directories refuse writes.
  export FERRY_TEST_S3_DATA=$FERRY_S3_DIR/data
  # The binary: a test may start a second gateway on that data over plain HTTP, where a proxy
  # can see which request it faults.
  export FERRY_TEST_S3_BIN=$FERRY_VERSITYGW
  export FERRY_TEST_S3_ACCESS_KEY=${FERRY_TEST_S3_ACCESS_KEY:-ferrytestaccess}
  export FERRY_TEST_S3_SECRET_KEY=${FERRY_TEST_S3_SECRET_KEY:-ferrytestsecret0123456789}
  export AWS_ACCESS_KEY_ID=$FERRY_TEST_S3_ACCESS_KEY
  export AWS_SECRET_ACCESS_KEY=$FERRY_TEST_S3_SECRET_KEY
  export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
  # Keys go in through versitygw's ROOT_* variables, not argv (so `ps` does not show them).
  # --quiet: no per-request log line. --keep-alive: reuse connections as S3 does (fasthttp
  # closes every connection after one request otherwise: 2.6x fewer small requests/s).
  env -u VGW_DEBUG ROOT_ACCESS_KEY_ID="$FERRY_TEST_S3_ACCESS_KEY" \
    ROOT_SECRET_ACCESS_KEY="$FERRY_TEST_S3_SECRET_KEY" \
    "$FERRY_VERSITYGW" --port "127.0.0.1:$FERRY_S3_PORT" \
      --cert "$FERRY_S3_DIR/tls/server.pem" --key "$FERRY_S3_DIR/tls/server.key" \
      --region us-east-1 --quiet ${FERRY_S3_ARGS---keep-alive} \
      posix "$FERRY_S3_DIR/data" > "$FERRY_S3_DIR/log" 2>&1 < /dev/null &
  FERRY_S3_PID=$!
  export FERRY_S3_PID
  local i
  for ((i = 0; i < 600; i++)); do
    if ! kill -0 "$FERRY_S3_PID" 2>/dev/null; then
      echo "ferry_start_s3: versitygw exited; its log:" >&2; cat "$FERRY_S3_DIR/log" >&2; return 1
    fi
    # Any HTTP answer over a verified TLS handshake means it is serving.
    curl -s -o /dev/null --cacert "$FERRY_TEST_S3_CA" "$FERRY_TEST_S3_ENDPOINT/" && break
    sleep 0.1
  done
  if ((i >= 600)); then
    echo "ferry_start_s3: versitygw not ready after 60 s; its log:" >&2; cat "$FERRY_S3_DIR/log" >&2
    return 1
  fi
  local code
  code=$(ferry_s3_curl PUT "/$FERRY_TEST_S3_BUCKET" -o "$FERRY_S3_DIR/mkbucket.out" -w '%{http_code}')
  if [ "$code" != 200 ]; then
    echo "ferry_start_s3: CreateBucket answered $code:" >&2; cat "$FERRY_S3_DIR/mkbucket.out" >&2
    return 1
  fi
  echo "versitygw on $FERRY_TEST_S3_ENDPOINT, bucket $FERRY_TEST_S3_BUCKET ($FERRY_S3_DIR)" >&2
}

ferry_stop_s3() {
  [ -n "${FERRY_S3_DIR:-}" ] || return 0
  if [ -n "${FERRY_S3_PID:-}" ]; then
    kill "$FERRY_S3_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$FERRY_S3_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$FERRY_S3_PID" 2>/dev/null || true
    wait "$FERRY_S3_PID" 2>/dev/null || true
  fi
  rm -rf "$FERRY_S3_DIR"
  unset FERRY_S3_DIR FERRY_S3_PID FERRY_S3_PORT
}

# rclone remote "ferrys3:" for the running server. rclone has no per-remote CA setting: it takes
# the global `--ca-cert "$FERRY_TEST_S3_CA"` (RCLONE_CA_CERT, exported here, is the same flag).
# AWS_CA_BUNDLE must be unset for rclone: Debian's rclone 1.60 (aws-sdk-go v1) fails every S3
# call with "LoadCustomCABundleError ... unsupported transport" when it is set at all, and this
# machine's environment sets it. Unset here, in the calling shell.
ferry_rclone_s3_env() {
  unset AWS_CA_BUNDLE
  export RCLONE_CONFIG_FERRYS3_TYPE=s3
  export RCLONE_CONFIG_FERRYS3_PROVIDER=Other
  export RCLONE_CONFIG_FERRYS3_ENV_AUTH=false
  export RCLONE_CONFIG_FERRYS3_ACCESS_KEY_ID=$FERRY_TEST_S3_ACCESS_KEY
  export RCLONE_CONFIG_FERRYS3_SECRET_ACCESS_KEY=$FERRY_TEST_S3_SECRET_KEY
  export RCLONE_CONFIG_FERRYS3_ENDPOINT=$FERRY_TEST_S3_ENDPOINT
  export RCLONE_CONFIG_FERRYS3_REGION=us-east-1
  export RCLONE_CONFIG_FERRYS3_FORCE_PATH_STYLE=true
  export RCLONE_CA_CERT=$FERRY_TEST_S3_CA
  # rclone's Go client sends "Expect: 100-Continue" (capital C) on every part; versitygw's HTTP
  # server (fasthttp) only answers "100-continue", so each upload would stall for the 1 s
  # default timeout (17 MiB/s instead of hundreds). Send the body without waiting.
  export RCLONE_EXPECT_CONTINUE_TIMEOUT=0
}
