#!/usr/bin/env bash
# Installs and starts what Ferry's tests and benchmarks need, on a fresh Debian machine.
# Source it: `. scripts/services.sh; ferry_start_postgres`. Everything listens on loopback only.

# Downloads and builds kept between runs (the cargo target dir, versitygw); FERRY_CACHE moves it.
FERRY_CACHE=${FERRY_CACHE:-$HOME/.cache/ferry}
mkdir -p "$FERRY_CACHE"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FERRY_CACHE/target}

# Builds the binaries users deploy (release) and sets BIN to their directory; more packages
# with `-p` (the benchmarks add ferry-bench, and ferry-tests for faultproxy).
ferry_release_bins() {
  cargo build --release -p ferry-extract -p ferry-transform -p ferry-copy -p ferry-load -p ferry-admin "$@" >&2
  BIN=$CARGO_TARGET_DIR/release
}

# ferry_local_config DIR [EXT] [CHUNK]: the example configuration on the embedded default, every
# place under DIR (ledger.db, in/, staging/, spool/, warehouse/), files settled at once; EXT
# picks the source files (`**/*.EXT`), CHUNK sets extract.chunk_size. Printed to stdout.
ferry_local_config() {
  local dir=$1 ext=${2:-} chunk=${3:-}
  local extra=()
  [ -n "$ext" ] && extra+=(-e "s#glob = \"\\*\\*/\\*.avro\"#glob = \"**/*.$ext\"#")
  [ -n "$chunk" ] && extra+=(-e "s#chunk_size = \"64MiB\"#chunk_size = \"$chunk\"#")
  sed -e "s#sqlite://ferry-ledger.db#sqlite://$dir/ledger.db#" -e "s#\"/data/incoming\"#\"$dir/in\"#" \
      -e "s#\"/data/staging\"#\"$dir/staging\"#" -e "s#\"/var/spool/ferry\"#\"$dir/spool\"#" \
      -e "s#\"/data/warehouse\"#\"$dir/warehouse\"#" -e 's#settle = "10s"#settle = "0s"#' \
      "${extra[@]}" "$(dirname "${BASH_SOURCE[0]}")/../deploy/ferry.example.toml"
}

ferry_apt_always() { # ferry_apt_always PACKAGE...: installs PACKAGEs from Debian
  echo "installing $* from Debian" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >&2
}

ferry_apt() { # ferry_apt CMD PACKAGE...: installs PACKAGEs unless CMD already exists
  local cmd=$1; shift
  if ! command -v "$cmd" >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/"$cmd" >/dev/null 2>&1; then
    echo "installing $* from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@") >&2
  fi
}

ferry_pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

# Starts a throwaway PostgreSQL on 127.0.0.1 and exports FERRY_TEST_POSTGRES. Stopped by
# ferry_stop_postgres (the caller traps EXIT). With FERRY_PG_ALSO="ADDRESS SUBNET" it also
# listens on ADDRESS and trusts clients from SUBNET (network namespaces behind a bridge).
ferry_start_postgres() {
  ferry_apt initdb postgresql
  local bin; bin=$(ferry_pg_bin)
  FERRY_PG_DIR=$(mktemp -d /tmp/ferry-pg.XXXXXX)
  chown postgres "$FERRY_PG_DIR" 2>/dev/null || true
  local as=(); [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
  "${as[@]}" "$bin/initdb" -D "$FERRY_PG_DIR/data" -U postgres --auth=trust -E UTF8 >/dev/null
  local listen=127.0.0.1
  if [ -n "${FERRY_PG_ALSO:-}" ]; then
    set -- $FERRY_PG_ALSO
    listen="$listen,$1"
    echo "host all all ${2:?FERRY_PG_ALSO wants an address and a subnet} trust" >> "$FERRY_PG_DIR/data/pg_hba.conf"
  fi
  # A port the kernel says is free now (or FERRY_PG_PORT); PostgreSQL binds it itself, so
  # another process may take it first: then it fails to start, and starts on another port.
  local fixed=${FERRY_PG_PORT:-} tries=0
  while :; do
    FERRY_PG_PORT=${fixed:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
    if "${as[@]}" "$bin/pg_ctl" -D "$FERRY_PG_DIR/data" -l "$FERRY_PG_DIR/log" -w -t 60 \
      -o "-c listen_addresses=$listen -p $FERRY_PG_PORT -c unix_socket_directories=$FERRY_PG_DIR -c max_connections=200" start >/dev/null; then
      break
    fi
    tries=$((tries + 1))
    if [ -n "$fixed" ] || [ "$tries" -ge 5 ]; then
      echo "postgres did not start on 127.0.0.1:$FERRY_PG_PORT:" >&2
      cat "$FERRY_PG_DIR/log" >&2
      return 1
    fi
  done
  export FERRY_PG_DIR FERRY_PG_PORT
  export FERRY_TEST_POSTGRES="postgres://postgres@127.0.0.1:$FERRY_PG_PORT/postgres"
  echo "postgres on 127.0.0.1:$FERRY_PG_PORT ($FERRY_PG_DIR)" >&2
}

ferry_stop_postgres() {
  [ -n "${FERRY_PG_DIR:-}" ] || return 0
  local as=(); [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
  "${as[@]}" "$(ferry_pg_bin)/pg_ctl" -D "$FERRY_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$FERRY_PG_DIR"
}

# Python readers used as independent checks of the published tables, and the Kubernetes
# schema checker for deploy/kubernetes.
# The Python packages the demo and the tests read tables with. Where the system's Python has
# them, nothing is installed. Else they go into a virtual environment under $FERRY_CACHE/venv
# (a stock Debian's Python refuses `pip install` outside one: PEP 668), which sees the system's
# packages too; ferry_python_path puts it first on PATH (in this shell: call it after a
# ferry_python_deps that ran in the background).
FERRY_PY_MODULES='pyarrow, duckdb, fastavro, cramjam, backports.zstd, yaml, kubernetes_validate, deltalake, pyspark, delta, pyiceberg, sqlalchemy, psycopg2'
ferry_python_path() {
  if [ -x "$FERRY_CACHE/venv/bin/python3" ]; then
    case ":$PATH:" in *":$FERRY_CACHE/venv/bin:"*) ;; *) export PATH="$FERRY_CACHE/venv/bin:$PATH" ;; esac
  fi
}
ferry_python_deps() {
  ferry_python_path
  python3 -c "import $FERRY_PY_MODULES" 2>/dev/null && return 0
  if [ ! -x "$FERRY_CACHE/venv/bin/python3" ]; then
    python3 -m venv --help >/dev/null 2>&1 && python3 -c 'import ensurepip' 2>/dev/null || ferry_apt_always python3-venv python3-pip
    python3 -m venv --system-site-packages "$FERRY_CACHE/venv.part" >&2 && rm -rf "$FERRY_CACHE/venv" && mv "$FERRY_CACHE/venv.part" "$FERRY_CACHE/venv"
    ferry_python_path
  fi
  # pyspark and delta-spark: Delta's reference reader (its jars: ferry_spark_jars); delta-spark
  # 4.4.0 is built for Spark 4.2.0.
  # pyiceberg with SQLAlchemy and psycopg2: the reader of Iceberg tables whose catalog is the ledger.
  echo "installing pyarrow, duckdb, fastavro (+ its snappy and zstd codecs), pyyaml, kubernetes-validate, deltalake, pyspark, delta-spark, pyiceberg from PyPI into $FERRY_CACHE/venv" >&2
  "$FERRY_CACHE/venv/bin/python3" -m pip install -q pyarrow duckdb fastavro cramjam backports.zstd pyyaml kubernetes-validate deltalake \
    'pyspark==4.2.0' 'delta-spark==4.4.0' 'pyiceberg[sql-sqlite,sql-postgres,pyarrow]==0.12.0' >&2
}

# Spark's packages for the tests that read tables with Spark: delta-spark, and for S3A the
# hadoop-aws of the Hadoop pyspark ships with the AWS SDK bundle it names. Resolved once, before
# any test starts, by Spark's own Ivy from Maven Central alone (its default chain looks in ~/.m2
# first, where a pom without its jar, left by Maven, fails the whole resolution), into
# $FERRY_CACHE/spark/<hash of pyspark's version and the packages>/jars, moved into place whole.
# Exports FERRY_SPARK_JARS (that directory): the tests load these jars as files and reach no
# network, so tests running at once never fetch into one Ivy cache together.
ferry_spark_jars() {
  ferry_python_deps
  # The directory goes to a file: Spark's JVM prints Ivy's progress on the same stdout.
  local answer; answer=$(mktemp)
  python3 - "$FERRY_CACHE/spark" "$answer" >&2 <<'PY' || { echo "spark: resolving the test packages from Maven Central failed" >&2; rm -f "$answer"; return 1; }
import glob, hashlib, os, shutil, sys, tempfile
import pyspark
root, answer = sys.argv[1], sys.argv[2]
api = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))[0]
hadoop = os.path.basename(api)[len("hadoop-client-api-"):-len(".jar")]
packages = ["io.delta:delta-spark_2.13:4.4.0", "org.apache.hadoop:hadoop-aws:" + hadoop]
key = hashlib.sha256("\n".join([pyspark.__version__] + packages).encode()).hexdigest()[:16]
final = os.path.join(root, key)
if os.path.exists(os.path.join(final, "complete")):
    open(answer, "w").write(os.path.join(final, "jars"))
    sys.exit(0)
os.makedirs(root, exist_ok=True)
tmp = tempfile.mkdtemp(dir=root, prefix="resolve.")
ivy = os.path.join(tmp, "ivysettings.xml")
with open(ivy, "w") as f:
    f.write('<ivysettings><settings defaultResolver="central"/><resolvers>'
            '<ibiblio name="central" m2compatible="true" root="https://repo1.maven.org/maven2/"/></resolvers></ivysettings>')
print(f"resolving {', '.join(packages)} from Maven Central into {final}", file=sys.stderr)
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("ferry-spark-jars")
    .config("spark.jars.ivySettings", ivy).config("spark.jars.ivy", os.path.join(tmp, "ivy"))
    .config("spark.jars.packages", ",".join(packages)).config("spark.ui.enabled", "false").getOrCreate())
spark.stop()
jars = sorted(glob.glob(os.path.join(tmp, "ivy", "jars", "*.jar")))
names = {os.path.basename(j) for j in jars}
assert any(n.startswith("io.delta_delta-spark") for n in names) and any(n.startswith("org.apache.hadoop_hadoop-aws") for n in names), names
os.makedirs(os.path.join(tmp, "out"))
os.rename(os.path.join(tmp, "ivy", "jars"), os.path.join(tmp, "out", "jars"))
open(os.path.join(tmp, "out", "complete"), "w").write("\n".join(sorted(names)) + "\n")
shutil.rmtree(final, ignore_errors=True)
os.rename(os.path.join(tmp, "out"), final)
shutil.rmtree(tmp)
open(answer, "w").write(os.path.join(final, "jars"))
PY
  FERRY_SPARK_JARS=$(cat "$answer")
  rm -f "$answer"
  [ -d "$FERRY_SPARK_JARS" ] || { echo "spark: no jar directory resolved" >&2; return 1; }
  export FERRY_SPARK_JARS
  echo "spark test jars: $FERRY_SPARK_JARS" >&2
}

# Spark as a reader of Iceberg tables: iceberg-spark-runtime is built for Spark 4.1 (not the
# pyspark 4.2 that reads Delta above, whose catalog interfaces it cannot load), so pyspark 4.1.1
# goes into a venv of its own, with the runtime and the JDBC drivers of the ledger's databases
# fetched from Maven Central into $FERRY_CACHE/iceberg-spark/<versions>/jars, moved into place
# whole. Exports FERRY_ICEBERG_SPARK_PYTHON and FERRY_ICEBERG_SPARK_JARS; the tests reach no
# network.
FERRY_ICEBERG_SPARK_JAR_LIST='org/apache/iceberg/iceberg-spark-runtime-4.1_2.13/1.12.0/iceberg-spark-runtime-4.1_2.13-1.12.0.jar
org/xerial/sqlite-jdbc/3.51.1.0/sqlite-jdbc-3.51.1.0.jar
org/postgresql/postgresql/42.7.4/postgresql-42.7.4.jar'
ferry_iceberg_spark() {
  local venv="$FERRY_CACHE/venv-spark41"
  if ! "$venv/bin/python3" -c 'import pyspark; assert pyspark.__version__ == "4.1.1"' 2>/dev/null; then
    echo "installing pyspark 4.1.1 from PyPI into $venv (Spark for Iceberg's runtime)" >&2
    rm -rf "$venv.part"
    python3 -m venv "$venv.part" >&2 && "$venv.part/bin/python3" -m pip install -q 'pyspark==4.1.1' >&2 \
      || { echo "iceberg-spark: installing pyspark 4.1.1 failed" >&2; return 1; }
    rm -rf "$venv" && mv "$venv.part" "$venv"
    # The venv was made under another name: its scripts' #! lines name that one; python3 -m is used.
  fi
  local key; key=$(printf '%s' "$FERRY_ICEBERG_SPARK_JAR_LIST" | sha256sum | cut -c1-16)
  local dir="$FERRY_CACHE/iceberg-spark/$key"
  if [ ! -f "$dir/complete" ]; then
    rm -rf "$dir.part" && mkdir -p "$dir.part/jars"
    local j
    for j in $FERRY_ICEBERG_SPARK_JAR_LIST; do
      echo "fetching $(basename "$j") from Maven Central" >&2
      curl -fsSL --retry 3 --max-time 600 -o "$dir.part/jars/$(basename "$j")" "https://repo1.maven.org/maven2/$j" \
        || { echo "iceberg-spark: fetching $j failed" >&2; return 1; }
    done
    touch "$dir.part/complete" && rm -rf "$dir" && mv "$dir.part" "$dir"
  fi
  export FERRY_ICEBERG_SPARK_PYTHON="$venv/bin/python3" FERRY_ICEBERG_SPARK_JARS="$dir/jars"
  echo "iceberg spark: $FERRY_ICEBERG_SPARK_PYTHON, $FERRY_ICEBERG_SPARK_JARS" >&2
}

# The tools that read what deploy/ ships: Prometheus and promtool (a real scrape in the tests),
# systemd-analyze (unit files); and strace, which shows the durability test the order of a
# stage's fsyncs and unlinks.
ferry_deploy_tools() {
  ferry_apt prometheus prometheus
  ferry_apt prometheus-pushgateway prometheus-pushgateway
  ferry_apt systemd-analyze systemd
  ferry_apt strace strace
}
