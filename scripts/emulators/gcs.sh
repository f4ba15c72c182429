#!/usr/bin/env bash
# A Google Cloud Storage emulator for Ferry's tests: ferry-gcs (fake-gcs-server's storage plus
# the XML API writes object_store sends; source in scripts/emulators/gcs), serving HTTPS itself
# on 127.0.0.1 with a certificate signed by a throwaway CA made here (FERRY_GCS_SCHEME=http for
# plain HTTP), in memory, one bucket.
#
# Source it:   . scripts/gcs.sh; trap ferry_stop_gcs EXIT; ferry_start_gcs   (start also installs)
# Exports:     FERRY_TEST_GCS_ENDPOINT (https://127.0.0.1:PORT), FERRY_TEST_GCS_BUCKET (ferry),
#              FERRY_TEST_GCS_CA (PEM of the CA; empty with http), FERRY_TEST_GCS_SERVICE_ACCOUNT
#              (path of a fake service-account JSON: disable_oauth, gcs_base_url = the endpoint),
#              and GOOGLE_SERVICE_ACCOUNT/GOOGLE_BUCKET for GoogleCloudStorageBuilder::from_env().
# object_store: GoogleCloudStorageBuilder::new().with_bucket_name(bucket)
#                 .with_service_account_path(FERRY_TEST_GCS_SERVICE_ACCOUNT)   // no OAuth, no key
#                 .with_base_url(endpoint)          // also in the JSON; explicit wins
#                 .with_client_options(ClientOptions::new().with_root_certificate(ca))
#              (with_skip_signature alone is not enough: object_store's PUT/POST/DELETE path asks the
#              credential provider anyway, which then goes to the GCE metadata server.)
# Limits:      objects and multipart parts live in memory; no ACLs, no signed URLs.
# Options:     FERRY_GCS_PORT picks the port; FERRY_GCS_SCHEME (https|http); FERRY_CACHE
#              (default ~/.cache/ferry) holds the binary.

. "$(dirname "${BASH_SOURCE[0]}")/../tls.sh"

FERRY_CACHE=${FERRY_CACHE:-$HOME/.cache/ferry}
mkdir -p "$FERRY_CACHE"

# ferry-gcs (scripts/emulators/gcs): fake-gcs-server's storage with the XML writes object_store
# sends, built from the Go module proxy (~2 min cold; instant when the sources are unchanged).
FERRY_GCS_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/gcs" && pwd)
FERRY_GCS_BIN=$FERRY_CACHE/bin/ferry-gcs

ferry_install_gcs() {
  command -v go >/dev/null 2>&1 || PATH=$PATH:/usr/local/go/bin
  local stamp; stamp=$(cat "$FERRY_GCS_SRC"/go.mod "$FERRY_GCS_SRC"/go.sum "$FERRY_GCS_SRC"/*.go | sha256sum | cut -c1-16)
  if ! { [ -x "$FERRY_GCS_BIN" ] && [ "$(cat "$FERRY_GCS_BIN.stamp" 2>/dev/null)" = "$stamp" ]; }; then
    echo "building ferry-gcs (fake-gcs-server from the Go module proxy)" >&2
    mkdir -p "$FERRY_CACHE/bin"
    (cd "$FERRY_GCS_SRC" && GOFLAGS="-mod=readonly -buildvcs=false" go build -o "$FERRY_GCS_BIN" .) >&2 || return 1
    echo "$stamp" > "$FERRY_GCS_BIN.stamp"
  fi
}

# curl against the emulator: ferry_gcs_curl METHOD PATH [curl args...]  (no auth needed)
ferry_gcs_curl() {
  local method=$1 path=$2; shift 2
  local ca=(); [ -n "${FERRY_TEST_GCS_CA:-}" ] && ca=(--cacert "$FERRY_TEST_GCS_CA")
  curl -sS "${ca[@]}" -X "$method" "$@" "$FERRY_TEST_GCS_ENDPOINT$path"
}

# Starts ferry-gcs on 127.0.0.1:<free port> with the bucket, exports the variables
# above. Stopped by ferry_stop_gcs (the caller traps EXIT).
ferry_start_gcs() {
  ferry_start_on_free_port FERRY_GCS_PORT ferry_start_gcs_try ferry_stop_gcs
}

ferry_start_gcs_try() {
  ferry_install_gcs || return 1
  FERRY_GCS_DIR=$(mktemp -d /tmp/ferry-gcs.XXXXXX)
  local scheme=${FERRY_GCS_SCHEME:-https} tls=()
  FERRY_GCS_PORT=${FERRY_GCS_PORT:-$(ferry_free_port)}
  export FERRY_GCS_DIR FERRY_GCS_PORT
  export FERRY_TEST_GCS_ENDPOINT="$scheme://127.0.0.1:$FERRY_GCS_PORT"
  export FERRY_TEST_GCS_BUCKET=ferry
  export FERRY_TEST_GCS_CA=""
  if [ "$scheme" = https ]; then
    mkdir -p "$FERRY_GCS_DIR/tls"
    ferry_make_certs "$FERRY_GCS_DIR/tls" || { echo "ferry_start_gcs: openssl failed" >&2; return 1; }
    FERRY_TEST_GCS_CA=$FERRY_GCS_DIR/tls/ca.pem
    tls=(-cert "$FERRY_GCS_DIR/tls/server.pem" -key "$FERRY_GCS_DIR/tls/server.key")
  fi
  # The fake service account object_store reads: no OAuth (an empty bearer), base URL here.
  export FERRY_TEST_GCS_SERVICE_ACCOUNT=$FERRY_GCS_DIR/service-account.json
  printf '{"gcs_base_url": "%s", "disable_oauth": true, "client_email": "", "private_key_id": "", "private_key": ""}\n' \
    "$FERRY_TEST_GCS_ENDPOINT" > "$FERRY_TEST_GCS_SERVICE_ACCOUNT"
  export GOOGLE_SERVICE_ACCOUNT=$FERRY_TEST_GCS_SERVICE_ACCOUNT GOOGLE_BUCKET=$FERRY_TEST_GCS_BUCKET
  (cd "$FERRY_GCS_DIR" && exec "$FERRY_GCS_BIN" -scheme "$scheme" "${tls[@]}" \
      -host 127.0.0.1 -port "$FERRY_GCS_PORT" -buckets "$FERRY_TEST_GCS_BUCKET") > "$FERRY_GCS_DIR/log" 2>&1 < /dev/null &
  FERRY_GCS_PID=$!
  export FERRY_GCS_PID
  local i
  for ((i = 0; i < 600; i++)); do
    if ! kill -0 "$FERRY_GCS_PID" 2>/dev/null; then
      echo "ferry_start_gcs: ferry-gcs exited; its log:" >&2; cat "$FERRY_GCS_DIR/log" >&2; return 1
    fi
    [ "$(ferry_gcs_curl GET /_internal/healthcheck -o /dev/null -w '%{http_code}' 2>/dev/null)" = 200 ] && break
    sleep 0.1
  done
  if ((i >= 600)); then
    echo "ferry_start_gcs: ferry-gcs not ready after 60 s; its log:" >&2; cat "$FERRY_GCS_DIR/log" >&2
    return 1
  fi
  echo "ferry-gcs on $FERRY_TEST_GCS_ENDPOINT, bucket $FERRY_TEST_GCS_BUCKET ($FERRY_GCS_DIR)" >&2
}

ferry_stop_gcs() {
  [ -n "${FERRY_GCS_DIR:-}" ] || return 0
  if [ -n "${FERRY_GCS_PID:-}" ]; then
    kill "$FERRY_GCS_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$FERRY_GCS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$FERRY_GCS_PID" 2>/dev/null || true
    wait "$FERRY_GCS_PID" 2>/dev/null || true
  fi
  rm -rf "$FERRY_GCS_DIR"
  unset FERRY_GCS_DIR FERRY_GCS_PID FERRY_GCS_PORT GOOGLE_SERVICE_ACCOUNT GOOGLE_BUCKET
}
