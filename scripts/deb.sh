#!/usr/bin/env bash
# Builds a Debian package of Ferry for hosts that install packages rather than source trees:
# the five binaries in /usr/bin, the systemd units in /usr/lib/systemd/system, the
# configuration skeleton and the secrets file as conffiles (an upgrade never overwrites them),
# man pages, bash and zsh completions, the rest of deploy/ in /usr/share/ferry. The package's
# postinst makes user ferry and its directories and, on a first install, creates the ledger
# the skeleton names (ferry-migrate.service); it starts no stage. After an upgrade, migrate the
# ledger yourself (after a backup): `systemctl start ferry-migrate.service`.
#
#   scripts/deb.sh                   release build (cargo), package into target/debian/
#   scripts/deb.sh --bin-dir DIR     package binaries already built in DIR
#   scripts/deb.sh --out DIR         write the .deb into DIR
#   FERRY_DEB_COMPRESSION=none       dpkg-deb's compressor (default xz)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin_dir="" out=""
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "deb.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
out=${out:-$target/debian}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

install_args=(--root "$stage" --prefix /usr)
[ -n "$bin_dir" ] && install_args+=(--bin-dir "$bin_dir")
"$repo/deploy/install.sh" "${install_args[@]}" >/dev/null
# Units a package ships go to the vendor directory; /etc/systemd/system is the admin's.
install -d "$stage/usr/lib/systemd/system"
mv "$stage"/etc/systemd/system/* "$stage/usr/lib/systemd/system/"
rmdir -p --ignore-fail-on-non-empty "$stage/etc/systemd/system"

install -d "$stage/DEBIAN"
installed_kib=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: ferry
Version: $version
Architecture: $arch
Maintainer: Ferry developers <ferry@localhost>
Installed-Size: $installed_kib
Depends: libc6, util-linux, adduser
Recommends: libgssapi-krb5-2
Section: utils
Priority: optional
Description: ETL pipeline that keeps moving data when the network does not
 Four stage binaries (ferry-extract, ferry-transform, ferry-copy, ferry-load) and the
 ferry admin tool share one work ledger (SQLite or PostgreSQL); each chunk is retried
 on its own with deadlines and backoff, and published exactly once into Hive-partitioned
 or Delta tables. Run the stages from the systemd timers or services shipped here.
CONTROL
printf '%s\n' /etc/ferry/ferry.toml /etc/ferry/ferry.env > "$stage/DEBIAN/conffiles"
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
# User ferry and its directories; on a first install, the ledger the skeleton names. Into
# another root (dpkg --root, DPKG_ROOT set), only files: no user, nothing started.
set -e
[ "$1" = configure ] || exit 0
[ -z "$DPKG_ROOT" ] || exit 0
getent group ferry >/dev/null || addgroup --system ferry
getent passwd ferry >/dev/null || adduser --system --ingroup ferry --home /var/lib/ferry --no-create-home --shell /usr/sbin/nologin ferry
chown ferry:ferry /var/spool/ferry /var/lib/ferry /var/lib/ferry/metrics /var/log/ferry
chown root:ferry /etc/ferry/ferry.toml /etc/ferry/ferry.env
chmod 0640 /etc/ferry/ferry.toml /etc/ferry/ferry.env
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  if [ -z "$2" ]; then
    systemctl start ferry-migrate.service || echo "ferry: the ledger was not created (journalctl -u ferry-migrate); edit /etc/ferry/ferry.toml, then systemctl start ferry-migrate.service" >&2
  else
    echo "ferry: upgraded from $2; back the ledger up, then: systemctl start ferry-migrate.service" >&2
  fi
fi
POSTINST
chmod 0755 "$stage/DEBIAN/postinst"
mkdir -p "$out"
deb="$out/ferry_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${FERRY_DEB_COMPRESSION:-xz}" --build "$stage" "$deb" >/dev/null
echo "$deb"
