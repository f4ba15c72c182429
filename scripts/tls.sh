#!/usr/bin/env bash
# Helpers the test servers share (scripts/s3.sh, scripts/emulators/gcs.sh,
# scripts/emulators/azurite.sh): a free loopback port, and a throwaway CA with a server
# certificate for 127.0.0.1, so every server speaks real TLS.

# A free TCP port on 127.0.0.1.
ferry_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
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
