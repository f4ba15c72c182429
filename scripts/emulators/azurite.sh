#!/usr/bin/env bash
# An Azure Blob Storage emulator for Ferry's tests: Azurite's blob service (npm), serving
# HTTPS itself on 127.0.0.1 with a certificate signed by a throwaway CA made here
# (FERRY_AZURITE_SCHEME=http for plain HTTP), in-memory, one container, strict mode (SharedKey
# signatures and API versions are checked, as Azure does).
#
# Source it:   . scripts/azurite.sh; trap ferry_stop_azurite EXIT; ferry_start_azurite
# Exports:     FERRY_TEST_AZURE_ENDPOINT (https://127.0.0.1:PORT/devstoreaccount1: the account URL,
#              path-style), FERRY_TEST_AZURE_ACCOUNT (devstoreaccount1), FERRY_TEST_AZURE_KEY (the
#              well-known emulator key), FERRY_TEST_AZURE_CONTAINER (ferry), FERRY_TEST_AZURE_CA
#              (PEM of the CA; empty with http), AZURITE_BLOB_STORAGE_URL (https://127.0.0.1:PORT,
#              read by object_store's with_use_emulator(true)).
# object_store: MicrosoftAzureBuilder::new().with_account(account).with_access_key(key)
#                 .with_container_name(container).with_endpoint(endpoint)
#                 .with_allow_http(true)            // only for FERRY_AZURITE_SCHEME=http
#                 .with_client_options(ClientOptions::new().with_root_certificate(ca))
#              (with_use_emulator(true) ignores with_endpoint and reads the process-wide
#              AZURITE_BLOB_STORAGE_URL instead, default http://127.0.0.1:10000.)
# Options:     FERRY_AZURITE_PORT picks the port; FERRY_AZURITE_SCHEME (https|http);
#              FERRY_AZURITE_ARGS (default "--inMemoryPersistence") replaces the storage flags
#              (e.g. "--location DIR" to keep blobs on disk); FERRY_CACHE (default ~/.cache/ferry)
#              holds the npm install.

. "$(dirname "${BASH_SOURCE[0]}")/../tls.sh"

FERRY_CACHE=${FERRY_CACHE:-$HOME/.cache/ferry}
mkdir -p "$FERRY_CACHE"

FERRY_AZURITE_VERSION=${FERRY_AZURITE_VERSION:-3.35.0}
FERRY_AZURITE_HOME=$FERRY_CACHE/azurite
FERRY_AZURITE_MAIN=$FERRY_AZURITE_HOME/node_modules/azurite/dist/src/blob/main.js

# The emulator's well-known account and key (public, the same in every Azurite).
FERRY_AZURITE_ACCOUNT=devstoreaccount1
FERRY_AZURITE_KEY='Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=='

ferry_azurite_installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
    "$FERRY_AZURITE_HOME/node_modules/azurite/package.json" 2>/dev/null
}

# Installs Node.js from Debian if missing, and Azurite from npm (~1 min with a cold npm cache;
# instant when the pinned version is already there).
ferry_install_azurite() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "installing nodejs and npm from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >&2 || return 1
  fi
  if [ "$(ferry_azurite_installed_version)" != "$FERRY_AZURITE_VERSION" ]; then
    echo "installing azurite $FERRY_AZURITE_VERSION from npm" >&2
    mkdir -p "$FERRY_AZURITE_HOME"
    # npm 11 refuses `install --prefix DIR` when DIR has no package.json (ENOENT): give it one.
    [ -f "$FERRY_AZURITE_HOME/package.json" ] || echo '{"private": true}' > "$FERRY_AZURITE_HOME/package.json"
    (cd "$FERRY_AZURITE_HOME" && npm install --no-audit --no-fund --loglevel=error \
       "azurite@$FERRY_AZURITE_VERSION") >&2 || return 1
  fi
}

# A SharedKey-signed request, signed as object_store signs (x-ms-version 2023-11-03, canonical
# resource "/<account><url path>"): ferry_azure_request METHOD PATH?QUERY [BODY_FILE [HEADER:VALUE...]]
# PATH is under the account URL (e.g. /ferry/a/b.txt). Prints the status, then the body.
ferry_azure_request() {
  python3 - "$@" <<'EOF'
import base64, datetime, hashlib, hmac, os, ssl, sys, urllib.error, urllib.parse, urllib.request
method, path = sys.argv[1], sys.argv[2]
body = open(sys.argv[3], "rb").read() if len(sys.argv) > 3 and sys.argv[3] else b""
extra = dict(h.split(":", 1) for h in sys.argv[4:])
account, key = os.environ["FERRY_TEST_AZURE_ACCOUNT"], base64.b64decode(os.environ["FERRY_TEST_AZURE_KEY"])
url = os.environ["FERRY_TEST_AZURE_ENDPOINT"] + path
h = {k.lower(): v.strip() for k, v in extra.items()}
h["x-ms-date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT")
h.setdefault("x-ms-version", "2023-11-03")
h.setdefault("content-type", "application/octet-stream")  # else urllib adds one, unsigned
h["content-length"] = str(len(body))
u = urllib.parse.urlsplit(url)
res = f"/{account}{u.path}\n"
q = urllib.parse.parse_qsl(u.query, keep_blank_values=True)
for name in sorted({k for k, _ in q}):
    res += name.lower() + ":" + ",".join(sorted(v for k, v in q if k == name)) + "\n"
sts = "\n".join([method] + [h.get(k, "") for k in ("content-encoding", "content-language")]
                + ["" if h["content-length"] == "0" else h["content-length"]]
                + [h.get(k, "") for k in ("content-md5", "content-type", "date", "if-modified-since",
                   "if-match", "if-none-match", "if-unmodified-since", "range")]) + "\n" \
    + "".join(f"{k}:{h[k]}\n" for k in sorted(k for k in h if k.startswith("x-ms"))) + res[:-1]
sig = base64.b64encode(hmac.new(key, sts.encode(), hashlib.sha256).digest()).decode()
h["authorization"] = f"SharedKey {account}:{sig}"
ctx = ssl.create_default_context(cafile=os.environ.get("FERRY_TEST_AZURE_CA") or None)
req = urllib.request.Request(url, data=body if body or method in ("PUT", "POST") else None, method=method, headers=h)
try:
    r = urllib.request.urlopen(req, context=ctx)
except urllib.error.HTTPError as e:
    r = e
print(r.status)
sys.stdout.write(r.read().decode(errors="replace"))
EOF
}

# Starts Azurite's blob service on 127.0.0.1:<free port>, creates the container, exports the
# variables above. Stopped by ferry_stop_azurite (the caller traps EXIT).
ferry_start_azurite() {
  ferry_start_on_free_port FERRY_AZURITE_PORT ferry_start_azurite_try ferry_stop_azurite
}

ferry_start_azurite_try() {
  ferry_install_azurite || return 1
  FERRY_AZURITE_DIR=$(mktemp -d /tmp/ferry-azurite.XXXXXX)
  local scheme=${FERRY_AZURITE_SCHEME:-https} tls=() ca=()
  FERRY_AZURITE_PORT=${FERRY_AZURITE_PORT:-$(ferry_free_port)}
  export FERRY_AZURITE_DIR FERRY_AZURITE_PORT
  export AZURITE_BLOB_STORAGE_URL="$scheme://127.0.0.1:$FERRY_AZURITE_PORT"
  export FERRY_TEST_AZURE_ENDPOINT="$AZURITE_BLOB_STORAGE_URL/$FERRY_AZURITE_ACCOUNT"
  export FERRY_TEST_AZURE_ACCOUNT=$FERRY_AZURITE_ACCOUNT FERRY_TEST_AZURE_KEY=$FERRY_AZURITE_KEY
  export FERRY_TEST_AZURE_CONTAINER=ferry
  export FERRY_TEST_AZURE_CA=""
  if [ "$scheme" = https ]; then
    mkdir -p "$FERRY_AZURITE_DIR/tls"
    ferry_make_certs "$FERRY_AZURITE_DIR/tls" || { echo "ferry_start_azurite: openssl failed" >&2; return 1; }
    FERRY_TEST_AZURE_CA=$FERRY_AZURITE_DIR/tls/ca.pem
    tls=(--cert "$FERRY_AZURITE_DIR/tls/server.pem" --key "$FERRY_AZURITE_DIR/tls/server.key")
    ca=(--cacert "$FERRY_TEST_AZURE_CA")
  fi
  # Only the blob service (azurite-blob), so no queue/table ports. The working directory is the
  # temp dir: without --location Azurite puts whatever it writes there.
  (cd "$FERRY_AZURITE_DIR" && exec node "$FERRY_AZURITE_MAIN" --blobHost 127.0.0.1 \
      --blobPort "$FERRY_AZURITE_PORT" "${tls[@]}" --disableTelemetry --silent \
      ${FERRY_AZURITE_ARGS---inMemoryPersistence}) > "$FERRY_AZURITE_DIR/log" 2>&1 < /dev/null &
  FERRY_AZURITE_PID=$!
  export FERRY_AZURITE_PID
  local i
  for ((i = 0; i < 600; i++)); do
    if ! kill -0 "$FERRY_AZURITE_PID" 2>/dev/null; then
      echo "ferry_start_azurite: azurite exited; its log:" >&2; cat "$FERRY_AZURITE_DIR/log" >&2; return 1
    fi
    # Any HTTP answer (403 without a signature) over a verified TLS handshake means it is serving.
    curl -s -o /dev/null "${ca[@]}" "$AZURITE_BLOB_STORAGE_URL/" && break
    sleep 0.1
  done
  if ((i >= 600)); then
    echo "ferry_start_azurite: azurite not ready after 60 s; its log:" >&2; cat "$FERRY_AZURITE_DIR/log" >&2
    return 1
  fi
  local out
  out=$(ferry_azure_request PUT "/$FERRY_TEST_AZURE_CONTAINER?restype=container")
  if [ "${out%%$'\n'*}" != 201 ]; then
    echo "ferry_start_azurite: Create Container answered:" >&2; echo "$out" >&2
    return 1
  fi
  echo "azurite on $FERRY_TEST_AZURE_ENDPOINT, container $FERRY_TEST_AZURE_CONTAINER ($FERRY_AZURITE_DIR)" >&2
}

ferry_stop_azurite() {
  [ -n "${FERRY_AZURITE_DIR:-}" ] || return 0
  if [ -n "${FERRY_AZURITE_PID:-}" ]; then
    kill "$FERRY_AZURITE_PID" 2>/dev/null || true
    local i
    for ((i = 0; i < 50; i++)); do kill -0 "$FERRY_AZURITE_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$FERRY_AZURITE_PID" 2>/dev/null || true
    wait "$FERRY_AZURITE_PID" 2>/dev/null || true
  fi
  rm -rf "$FERRY_AZURITE_DIR"
  unset FERRY_AZURITE_DIR FERRY_AZURITE_PID FERRY_AZURITE_PORT AZURITE_BLOB_STORAGE_URL
}
