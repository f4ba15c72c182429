#!/usr/bin/env bash
# Helpers the test servers share (scripts/s3.sh, scripts/emulators/gcs.sh,
# scripts/emulators/azurite.sh): a free loopback port (and starting a server on one), and a throwaway CA with a server
# certificate for 127.0.0.1, so every server speaks real TLS.

# A free TCP port on 127.0.0.1.
ferry_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs server start function $2 until it succeeds, at most three times, when port variable $1
# was not set by the caller: a port found free here may be taken by another process before the
# server binds it (the server exits, the start fails), so each try finds another. $3, the
# server's stop function, clears a failed try. A port the caller set is tried once.
ferry_start_on_free_port() {
  local var=$1 start=$2 stop=$3 try
  if [ -n "${!var:-}" ]; then
    "$start"
    return
  fi
  for try in 1 2 3; do
    "$start" && return 0
    "$stop"
    unset "$var"
    echo "$start: failed on a port found free (try $try of 3)" >&2
  done
  return 1
}

# Makes CA + server certificate (SAN IP:127.0.0.1, DNS:localhost) in directory $1:
# ca.pem, ca.key, server.pem, server.key.
ferry_make_certs() {
  local d=$1
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=Ferry test CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null || return 1
  openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$d/server.key" -out "$d/server.csr" 2>/dev/null || return 1
  printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" "subjectAltName=IP:127.0.0.1,DNS:localhost" > "$d/server.ext"
  openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$d/server.ext" -out "$d/server.pem" 2>/dev/null || return 1
}
