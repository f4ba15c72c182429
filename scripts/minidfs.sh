#!/usr/bin/env bash
# A real HDFS for Ferry's tests and benchmarks: Hadoop's MiniDFSCluster (tests/minidfs), one
# JVM per cluster (NameNode + DataNode), all on 127.0.0.1. Source it:
#
#   . scripts/minidfs.sh
#   ferry_build_minidfs                 # mvn; first time downloads ~100 MB into ~/.m2
#   ferry_start_minidfs A               # exports FERRY_TEST_HDFS_A=hdfs://127.0.0.1:PORT
#   ferry_start_minidfs B               #   and FERRY_TEST_HDFS_A_CONF=<dir with core/hdfs-site.xml>
#   ferry_fsshell -fs "$FERRY_TEST_HDFS_A" -put file /dir/
#   HADOOP_CONF_DIR=$FERRY_TEST_HDFS_B_CONF ferry_fsshell -ls /
#   ferry_stop_minidfs A                # or with no name: stops every cluster started here
#
# HA (a NameNode pair nn0/nn1 behind nameservice ns1, nn0 active; see MiniDfs.java):
#   FERRY_MINIDFS_ARGS=--ha ferry_start_minidfs H    # FERRY_TEST_HDFS_H=hdfs://ns1
#   HADOOP_CONF_DIR=$FERRY_TEST_HDFS_H_CONF ferry_fsshell -ls hdfs://ns1/   # needs the conf dir
#   ferry_minidfs_failover H            # active -> standby, the other -> active; prints nn1/nn0
#   (two HA clusters at once: FERRY_MINIDFS_ARGS="--ha --nameservice ns2" for the second)
#
# A cluster also stops by itself (within ~1 s) when the shell that sourced this file exits, even
# by SIGKILL: its stdin then reaches EOF (see tests/minidfs/src/main/java/ferry/MiniDfs.java).
# Works under `set -euo pipefail`. Functions return non-zero on failure.

FERRY_MINIDFS_HOME=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/minidfs" && pwd)
# 2 cores, startup-bound: C1 only and serial GC start fastest; 512 MiB heap is plenty.
FERRY_MINIDFS_JAVA_OPTS=${FERRY_MINIDFS_JAVA_OPTS:--Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.net.preferIPv4Stack=true}
FERRY_FSSHELL_JAVA_OPTS=${FERRY_FSSHELL_JAVA_OPTS:--Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.net.preferIPv4Stack=true}
FERRY_MINIDFS_TIMEOUT=${FERRY_MINIDFS_TIMEOUT:-120}
FERRY_MINIDFS_NAMES=${FERRY_MINIDFS_NAMES:-}

# The build lives in the cache, not in the clone (every CI run is a fresh clone): under
# $FERRY_CACHE/<name>/<hash of the pom and the sources>, so a changed program builds anew and an
# unchanged one is never rebuilt. Its classpath file (classes first, then every dependency jar in
# ~/.m2) is what the tests and benchmarks run; exported for them. The helpers below serve every
# Java program of the tests (tests/minidfs, tests/iceberg-rest).
_ferry_java_key() {
  (cd "$1" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
FERRY_MINIDFS_BUILD=${FERRY_CACHE:-$HOME/.cache/ferry}/minidfs/$(_ferry_java_key "$FERRY_MINIDFS_HOME")
export FERRY_MINIDFS_CLASSPATH_FILE=$FERRY_MINIDFS_BUILD/classpath.txt

# _ferry_java_built BUILD: true when the build in BUILD is complete and every jar its classpath
# file names still exists.
_ferry_java_built() {
  local cpf=$1/classpath.txt
  [ -s "$cpf" ] && [ -d "$1/classes" ] || return 1
  local IFS=: entry
  for entry in $(cat "$cpf"); do
    [ -e "$entry" ] || return 1
  done
}

# _ferry_java_build NAME HOME BUILD: compiles the Maven project HOME into BUILD and writes its
# classpath file. Quick (no mvn run) when nothing changed. Built in a temporary copy, moved into
# place whole: a killed build leaves no half a build that looks done.
_ferry_java_build() {
  local name=$1 home=$2 build=$3
  _ferry_java_built "$build" && return 0
  if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
    echo "installing maven and a JDK from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven default-jdk-headless) >&2 || return 1
  fi
  echo "building $name with maven into $build (first run downloads its jars into ~/.m2)" >&2
  local parent; parent=$(dirname "$build")
  mkdir -p "$parent" || return 1
  local tmp; tmp=$(mktemp -d "$parent/build.XXXXXX") || return 1
  cp -r "$home/pom.xml" "$home/src" "$tmp/" || return 1
  (cd "$tmp" && mvn -q -B -Dstyle.color=never compile) >&2 || { echo "$name: maven build failed" >&2; rm -rf "$tmp"; return 1; }
  local deps="$tmp/target/deps-classpath.txt"
  [ -s "$deps" ] || { echo "$name: $deps missing after the build" >&2; rm -rf "$tmp"; return 1; }
  rm -rf "$build"
  mkdir -p "$build" || return 1
  mv "$tmp/target/classes" "$build/classes" || return 1
  printf '%s:%s\n' "$build/classes" "$(cat "$deps")" > "$build/classpath.txt.tmp"
  mv "$build/classpath.txt.tmp" "$build/classpath.txt"
  rm -rf "$tmp"
}

# Compiles tests/minidfs into the cache and writes its classpath file.
ferry_build_minidfs() {
  _ferry_java_build tests/minidfs "$FERRY_MINIDFS_HOME" "$FERRY_MINIDFS_BUILD"
}

# Compiles tests/iceberg-rest (Iceberg's REST catalog test server; see its pom.xml) into the
# cache and exports its classpath file as FERRY_ICEBERG_REST_CLASSPATH_FILE; the tests start
# one server each.
ferry_build_iceberg_rest() {
  local home build
  home=$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests/iceberg-rest" && pwd) || return 1
  build=${FERRY_CACHE:-$HOME/.cache/ferry}/iceberg-rest/$(_ferry_java_key "$home")
  _ferry_java_build tests/iceberg-rest "$home" "$build" || return 1
  export FERRY_ICEBERG_REST_CLASSPATH_FILE=$build/classpath.txt
}

# ferry_start_minidfs NAME: starts cluster NAME (letters, digits, _) in the background, waits
# for it, and exports FERRY_TEST_HDFS_<NAME> and FERRY_TEST_HDFS_<NAME>_CONF.
# FERRY_MINIDFS_NN_PORT picks the NameNode port (default 0 = a free one); FERRY_MINIDFS_ARGS adds
# arguments to ferry.MiniDfs, e.g. "--datanodes 2" or "--conf key=value" (a Hadoop setting), or
# "--ha" (an HA NameNode pair; FERRY_TEST_HDFS_<NAME> is then hdfs://ns1, usable only with
# <NAME>_CONF as HADOOP_CONF_DIR; "--ha --nameservice ns2" for another id).
# Note: a Hadoop client's complete() usually reaches the NameNode before the DataNode's block
# report does, and the Java client then retries after 400 ms: FsShell -put costs ~0.2 s per small
# file. Client-side cure, e.g. for a benchmark baseline:
#   ferry_fsshell -D dfs.client.block.write.locateFollowingBlock.initial.delay.ms=10 -fs ... -put
# (~40 ms per file). (dfs.namenode.file.close.num-committed-allowed=1 does NOT help here.)
ferry_start_minidfs() {
  local name=${1:?usage: ferry_start_minidfs NAME}
  name=${name^^}
  [[ $name =~ ^[A-Z0-9_]+$ ]] || { echo "minidfs: bad cluster name '$1'" >&2; return 1; }
  local pidvar=FERRY_MINIDFS_${name}_PID
  if [ -n "${!pidvar:-}" ] && kill -0 "${!pidvar}" 2>/dev/null; then
    echo "minidfs: cluster $name already running (pid ${!pidvar})" >&2
    return 1
  fi
  ferry_build_minidfs || return 1

  local dir pid keeper
  dir=$(mktemp -d "${TMPDIR:-/tmp}/ferry-minidfs-$name.XXXXXX")
  mkfifo "$dir/stdin"
  # shellcheck disable=SC2086
  ( exec java $FERRY_MINIDFS_JAVA_OPTS -cp "$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")" ferry.MiniDfs \
      --name "$name" --base-dir "$dir" --conf-dir "$dir/conf" --nn-port "${FERRY_MINIDFS_NN_PORT:-0}" \
      ${FERRY_MINIDFS_ARGS:-} <"$dir/stdin" >"$dir/stdout" 2>"$dir/log" ) &
  pid=$!
  # The JVM's stdin: a fifo whose only writer is this `tail`, which exits when the shell that
  # sourced this file ($$) does, and the JVM then stops on EOF. (No shell fd is involved, so
  # children of this shell, e.g. cargo, can't keep the cluster alive.)
  ( exec tail --pid=$$ -f /dev/null >"$dir/stdin" 2>/dev/null </dev/null ) &
  keeper=$!
  export "FERRY_MINIDFS_${name}_PID=$pid" "FERRY_MINIDFS_${name}_KEEPER=$keeper" "FERRY_MINIDFS_${name}_DIR=$dir"
  FERRY_MINIDFS_NAMES="$FERRY_MINIDFS_NAMES $name"

  local start=$SECONDS uri=
  while :; do
    uri=$(sed -n 's/^READY //p' "$dir/stdout" 2>/dev/null || true)
    [ -n "$uri" ] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "minidfs: cluster $name exited during startup; its log ($dir/log):" >&2
      cat "$dir/log" >&2
      ferry_stop_minidfs "$name"
      return 1
    fi
    if (( SECONDS - start >= FERRY_MINIDFS_TIMEOUT )); then
      echo "minidfs: cluster $name not ready after ${FERRY_MINIDFS_TIMEOUT}s; its log ($dir/log):" >&2
      cat "$dir/log" >&2
      ferry_stop_minidfs "$name"
      return 1
    fi
    sleep 0.1
  done
  export "FERRY_TEST_HDFS_${name}=$uri" "FERRY_TEST_HDFS_${name}_CONF=$dir/conf"
  echo "minidfs $name at $uri in $(( SECONDS - start ))s (pid $pid, conf $dir/conf, log $dir/log)" >&2
}

# ferry_stop_minidfs [NAME]: stops cluster NAME (every cluster started here if no NAME) and
# deletes its directory. Safe to call twice, or for a cluster never started (an EXIT trap).
ferry_stop_minidfs() {
  if [ $# -eq 0 ]; then
    local n
    for n in $FERRY_MINIDFS_NAMES; do ferry_stop_minidfs "$n"; done
    return 0
  fi
  local name=${1^^}
  local pidvar=FERRY_MINIDFS_${name}_PID dirvar=FERRY_MINIDFS_${name}_DIR keepervar=FERRY_MINIDFS_${name}_KEEPER
  local pid=${!pidvar:-} dir=${!dirvar:-} keeper=${!keepervar:-}
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "minidfs: cluster $name did not stop in 30s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  fi
  if [ -n "$keeper" ]; then
    kill -TERM "$keeper" 2>/dev/null || true
    wait "$keeper" 2>/dev/null || true
  fi
  [ -n "$dir" ] && rm -rf "$dir"
  FERRY_MINIDFS_NAMES=$(echo " $FERRY_MINIDFS_NAMES " | sed "s/ $name / /; s/^ *//; s/ *$//")
  unset "FERRY_MINIDFS_${name}_PID" "FERRY_MINIDFS_${name}_DIR" "FERRY_MINIDFS_${name}_KEEPER" \
    "FERRY_TEST_HDFS_${name}" "FERRY_TEST_HDFS_${name}_CONF"
}

# ferry_minidfs_failover NAME: for a cluster started with FERRY_MINIDFS_ARGS=--ha, makes the
# active NameNode standby and the other one active (the FAILOVER stdin line of MiniDfs.java),
# waits for that, and prints the id of the NameNode now active (nn0 or nn1) on stdout.
ferry_minidfs_failover() {
  local name=${1:?usage: ferry_minidfs_failover NAME}
  name=${name^^}
  local pidvar=FERRY_MINIDFS_${name}_PID dirvar=FERRY_MINIDFS_${name}_DIR
  local pid=${!pidvar:-} dir=${!dirvar:-}
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    echo "minidfs: cluster $name is not running" >&2
    return 1
  fi
  local before
  before=$(grep -cE '^(FAILED_OVER|FAILOVER_FAILED)( |$)' "$dir/stdout" || true)
  # The JVM's stdin fifo: the keeper `tail` still holds it open, so this is no EOF.
  timeout 10 sh -c 'echo FAILOVER > "$1"' sh "$dir/stdin" || { echo "minidfs: can't write to $name's stdin" >&2; return 1; }
  local start=$SECONDS line
  while :; do
    line=$(grep -E '^(FAILED_OVER|FAILOVER_FAILED)( |$)' "$dir/stdout" | sed -n "$((before + 1))p")
    [ -n "$line" ] && break
    if ! kill -0 "$pid" 2>/dev/null || (( SECONDS - start >= FERRY_MINIDFS_TIMEOUT )); then
      echo "minidfs: cluster $name did not answer FAILOVER (is it running with --ha?); log: $dir/log" >&2
      return 1
    fi
    sleep 0.05
  done
  case $line in
    "FAILED_OVER "*) echo "${line#FAILED_OVER }" ;;
    *) echo "minidfs: $name: $line (log: $dir/log)" >&2; return 1 ;;
  esac
}

# ferry_fsshell ARGS...: Hadoop's `hdfs dfs` (FsShell), e.g. -fs "$FERRY_TEST_HDFS_A" -ls /.
# With HADOOP_CONF_DIR set, that dir's core-site.xml / hdfs-site.xml are used (no -fs needed);
# an HA cluster (hdfs://ns1) needs it: `-fs hdfs://ns1` alone can't resolve the nameservice.
ferry_fsshell() {
  ferry_build_minidfs || return 1
  local cp
  cp=$(cat "$FERRY_MINIDFS_CLASSPATH_FILE")
  [ -n "${HADOOP_CONF_DIR:-}" ] && cp="$HADOOP_CONF_DIR:$cp"
  # shellcheck disable=SC2086
  java $FERRY_FSSHELL_JAVA_OPTS -cp "$cp" org.apache.hadoop.fs.FsShell "$@"
}
