#!/usr/bin/env bash
# Installs Ferry on a host: stripped release binaries, systemd units, a configuration skeleton,
# the ferry user and the directories the stages write. Safe to run again (an upgrade): it never
# overwrites /etc/ferry/ferry.toml or ferry.env.
#
#   deploy/install.sh                   build (cargo, release) and install under /usr/local
#   deploy/install.sh --bin-dir DIR     install binaries already built in DIR instead
#   deploy/install.sh --root DIR        install into DIR as if it were / (packaging, tests):
#                                       no user is created and nothing is started
#
# Then: edit /etc/ferry/ferry.toml (and secrets in /etc/ferry/ferry.env), check it with
# `ferry check-config`, create or migrate the ledger it names (`systemctl start
# ferry-migrate.service`: as user ferry, with the secrets file; again after every upgrade),
# and start either the timers (--once every minute) or the services:
#   systemctl enable --now ferry-extract.timer ferry-transform.timer ferry-copy.timer ferry-load.timer
#   systemctl enable --now ferry-{extract,transform,copy,load}-watch.service
# and, with either, cleanup (hourly) and the ledger's retention (nightly):
#   systemctl enable --now ferry-gc.timer ferry-prune.timer
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
root="" bin_dir="" prefix=/usr/local
while [ $# -gt 0 ]; do
  case $1 in
    --root) root=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
binaries=(ferry ferry-extract ferry-transform ferry-copy ferry-load)

if [ -z "$bin_dir" ]; then
  # `--version` names the commit built.
  FERRY_COMMIT=${FERRY_COMMIT:-$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
  export FERRY_COMMIT
  (cd "$repo" && cargo build --release --locked -p ferry-extract -p ferry-transform -p ferry-copy -p ferry-load -p ferry-admin)
  bin_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release
fi
for b in "${binaries[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "install.sh: $bin_dir/$b is missing; build first or drop --bin-dir" >&2; exit 1; }
done

echo "installing Ferry into ${root:-/} (binaries in $prefix/bin)"
install -d "$root$prefix/bin" "$root/etc/systemd/system" "$root/etc/ferry" \
  "$root$prefix/share/ferry" "$root$prefix/share/doc/ferry"
for b in "${binaries[@]}"; do
  install -m 0755 "$bin_dir/$b" "$root$prefix/bin/$b"
  strip "$root$prefix/bin/$b" 2>/dev/null || true
done

# Man pages and shell completions (bash, zsh) of the five binaries, written by `ferry` itself.
install -d "$root$prefix/share/man/man1" "$root$prefix/share/bash-completion/completions" "$root$prefix/share/zsh/site-functions"
"$root$prefix/bin/ferry" man --out "$root$prefix/share/man/man1" >/dev/null
"$root$prefix/bin/ferry" completions bash --out "$root$prefix/share/bash-completion/completions" >/dev/null
"$root$prefix/bin/ferry" completions zsh --out "$root$prefix/share/zsh/site-functions" >/dev/null

# Units name /usr/local/bin; another prefix is written into them.
for u in "$here"/systemd/*.service "$here"/systemd/*.timer; do
  sed "s#/usr/local/bin/#$prefix/bin/#g; s#/usr/local/share/#$prefix/share/#g" "$u" > "$root/etc/systemd/system/$(basename "$u")"
  chmod 0644 "$root/etc/systemd/system/$(basename "$u")"
done
# The rest for reference: cron file, Kubernetes manifests, alert rules, dashboard, docs.
cp -r "$here/cron" "$here/kubernetes" "$here/prometheus" "$here/grafana" "$root$prefix/share/ferry/"
install -m 0644 "$repo/README.md" "$repo/CONTRIBUTING.md" "$here/ferry.example.toml" "$root$prefix/share/doc/ferry/"
cp -r "$repo/docs" "$root$prefix/share/doc/ferry/"

# A configuration skeleton for this host: embedded SQLite ledger, spool under /var/spool.
if [ ! -e "$root/etc/ferry/ferry.toml" ]; then
  sed -e 's#^url = "sqlite://ferry-ledger.db"#url = "sqlite:///var/lib/ferry/ledger.db"#' \
      "$here/ferry.example.toml" > "$root/etc/ferry/ferry.toml"
  # It may hold secrets (S3 keys, a ledger URL with a password): readable by the stages only.
  chmod 0640 "$root/etc/ferry/ferry.toml"
  echo "wrote $root/etc/ferry/ferry.toml: edit source, staging, destination and table"
elif [ -n "$(find "$root/etc/ferry/ferry.toml" -perm -o=r 2>/dev/null)" ]; then
  chmod o-rwx "$root/etc/ferry/ferry.toml"
  echo "$root/etc/ferry/ferry.toml was readable by every user; it is no longer (it may hold secrets)"
fi
if [ ! -e "$root/etc/ferry/ferry.env" ]; then
  cat > "$root/etc/ferry/ferry.env" <<'ENV'
# Secrets for the Ferry stages, as environment variables (root-owned, readable by group ferry only).
# FERRY_LEDGER=postgres://ferry:PASSWORD@db.example.com/ferry
# AWS_ACCESS_KEY_ID=...
# AWS_SECRET_ACCESS_KEY=...
ENV
  chmod 0600 "$root/etc/ferry/ferry.env"
fi

install -d -m 0750 "$root/var/spool/ferry" "$root/var/log/ferry"
# /var/lib/ferry: the stages' locks and a SQLite ledger; metrics/: the textfiles --once runs
# write for node_exporter (--collector.textfile.directory=/var/lib/ferry/metrics), which must
# be able to read them (0755, as systemd's StateDirectory= makes it too).
install -d -m 0755 "$root/var/lib/ferry" "$root/var/lib/ferry/metrics"
if [ -z "$root" ]; then
  getent group ferry >/dev/null || groupadd --system ferry
  getent passwd ferry >/dev/null || useradd --system --gid ferry --home-dir /var/lib/ferry --shell /usr/sbin/nologin ferry
  chown ferry:ferry /var/spool/ferry /var/lib/ferry /var/lib/ferry/metrics /var/log/ferry
  chown root:ferry /etc/ferry/ferry.env /etc/ferry/ferry.toml && chmod 0640 /etc/ferry/ferry.env
  # The ledger the configuration names, created or migrated as the stages will use it.
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl start ferry-migrate.service || echo "ferry migrate failed (journalctl -u ferry-migrate): fix the ledger URL, then systemctl start ferry-migrate.service" >&2
  else
    runuser -u ferry -- sh -c 'set -a; [ -r /etc/ferry/ferry.env ] && . /etc/ferry/ferry.env; exec "$0" migrate --config /etc/ferry/ferry.toml' "$prefix/bin/ferry" \
      || echo "ferry migrate failed: fix the ledger URL, then run it again as user ferry" >&2
  fi
fi

cat <<EOF
installed: ${binaries[*]}
next:
  \$EDITOR /etc/ferry/ferry.toml && ferry check-config --config /etc/ferry/ferry.toml
  systemctl start ferry-migrate.service     # the ledger it names, created or migrated (again after each upgrade)
  systemctl enable --now ferry-extract.timer ferry-transform.timer ferry-copy.timer ferry-load.timer
  systemctl enable --now ferry-gc.timer ferry-prune.timer
  ferry status --config /etc/ferry/ferry.toml
EOF
