"""Driver of bench/latency.sh: capacity, latency at steady loads, idle CPU (see the script)."""

import os
import shlex
import sqlite3
import subprocess
import sys
import time

BIN, DIR = os.environ["BIN"], os.environ["DIR"]
LOADS = [int(x) for x in os.environ["LOADS"].split()]
SECONDS, RECORDS = float(os.environ["SECONDS_PER_LOAD"]), int(os.environ["RECORDS"])
BACKLOG, IDLE = int(os.environ["BACKLOG"]), float(os.environ["IDLE"])
STAGE_ARGS = shlex.split(os.environ.get("STAGE_ARGS", ""))
STAGES = ["extract", "transform", "copy", "load"]
WARMUP = 10.0  # seconds of each phase left out of its figures
INBOX = f"{DIR}/in"
os.makedirs(INBOX, exist_ok=True)
env = dict(os.environ, FERRY_CONFIG=f"{DIR}/ferry.toml", RUST_LOG="warn")


def gen(tag, files, seed):
    """`files` distinct Avro files of RECORDS events, in a directory of their own."""
    out = f"{DIR}/gen-{tag}"
    subprocess.run([f"{BIN}/ferry", "gen", "--format", "avro", "--codec", "null", "--out", out,
                    "--files", str(files), "--records", str(RECORDS), "--seed", str(seed)],
                   check=True, stdout=subprocess.DEVNULL)
    return sorted(os.path.join(out, f) for f in os.listdir(out))


def land(path, name):
    """One file lands: its mtime is now, then one rename into the watched directory."""
    os.utime(path)
    os.rename(path, f"{INBOX}/{name}")


def ledger():
    return sqlite3.connect(f"{DIR}/ledger.db", timeout=30)


def published(db, prefix):
    """(files chunked, chunks, chunks published) among the files named prefix*."""
    like = f"%/{prefix}%"
    files = db.execute("SELECT COUNT(*) FROM source_files WHERE state = 'chunked' AND uri LIKE ?", (like,)).fetchone()[0]
    chunks = db.execute("SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE ?", (like,)).fetchone()[0]
    done = db.execute(
        "SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id "
        "JOIN tasks t ON t.chunk_id = c.id AND t.stage = 'load' AND t.state = 'done' WHERE f.uri LIKE ?", (like,)).fetchone()[0]
    return files, chunks, done


def drain(db, prefix, files, timeout=900):
    start = time.time()
    while True:
        f, c, d = published(db, prefix)
        if f == files and c == d:
            return
        if time.time() - start > timeout:
            sys.exit(f"{prefix}: {f}/{files} files chunked, {d}/{c} chunks published after {timeout} s")
        time.sleep(0.05)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))] if xs else float("nan")


def figures(db, prefix, since_ms):
    """Per file: landing -> published; per chunk: the hops, in seconds."""
    rows = db.execute(
        "SELECT f.uri, f.mtime_ms, c.id, t.stage, t.created_at, t.attempted_at, t.finalized_at "
        "FROM source_files f JOIN chunks c ON c.file_id = f.id JOIN tasks t ON t.chunk_id = c.id "
        "WHERE f.uri LIKE ? AND f.mtime_ms >= ?", (f"%/{prefix}%", since_ms)).fetchall()
    per_file, hops, chunks = {}, {}, {}
    for uri, mtime, chunk, stage, created, attempted, finalized in rows:
        chunks.setdefault(chunk, {})[stage] = (mtime, created, attempted, finalized)
        if stage == "load":
            per_file[uri] = max(per_file.get(uri, 0.0), (finalized - mtime) / 1000)
    for c in chunks.values():
        hops.setdefault("staged", []).append((c["transform"][1] - c["transform"][0]) / 1000)
        for s in ("transform", "copy", "load"):
            _, created, attempted, finalized = c[s]
            hops.setdefault(f"{s} wait", []).append((attempted - created) / 1000)
            hops.setdefault(f"{s} work", []).append((finalized - attempted) / 1000)
    return list(per_file.values()), hops


def cpu_ticks(pids):
    total = {}
    for s, pid in pids.items():
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total[s] = int(fields[11]) + int(fields[12])  # utime + stime
    return total


def measure_capacity(db, lines):
    """Files/s of the four services through a backlog that lands at once."""
    files = gen("backlog", BACKLOG, 1)
    size = sum(os.path.getsize(f) for f in files) / len(files)
    t0 = time.time()
    for i, f in enumerate(files):
        land(f, f"backlog-{i:05}.avro")
    drain(db, "backlog-", BACKLOG)
    last = db.execute("SELECT MAX(t.finalized_at) FROM tasks t WHERE t.stage = 'load'").fetchone()[0] / 1000
    capacity = BACKLOG / (last - t0)
    lines.append(f"capacity: {BACKLOG} files of {size / 2**20:.1f} MiB ({RECORDS} events) landing at once, all published "
                 f"in {last - t0:.1f} s: {capacity:.2f} files/s = {capacity * RECORDS:,.0f} records/s")
    return capacity


procs = {}
try:
    for s in STAGES:
        log = open(f"{DIR}/log.{s}", "w")
        procs[s] = subprocess.Popen([f"{BIN}/ferry-{s}", "--watch", *STAGE_ARGS], env=env, stdout=log, stderr=subprocess.STDOUT)
    time.sleep(3)
    for s, p in procs.items():
        if p.poll() is not None:
            sys.exit(f"ferry-{s} exited at start: see {DIR}/log.{s}")
    db = ledger()
    tick = os.sysconf("SC_CLK_TCK")
    lines = []

    # 1. capacity (or the one given, so two builds run at the same arrival rates)
    if os.environ.get("CAPACITY"):
        capacity = float(os.environ["CAPACITY"])
        lines.append(f"capacity: {capacity:.2f} files/s, as given")
    else:
        capacity = measure_capacity(db, lines)

    # 2. steady loads
    print(lines[-1], flush=True)
    table = ["| load | files/s | files | p50 | p90 | p99 | max | staged p50/p99 | transform wait/work p99 | copy wait/work p99 | load wait/work p99 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, load in enumerate(LOADS):
        rate = capacity * load / 100
        count = max(1, int(rate * SECONDS))
        prefix = f"load{load}-"
        files = gen(f"load{load}", count, 100 + n)
        start = time.time()
        for i, f in enumerate(files):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            land(f, f"{prefix}{i:05}.avro")
        drain(db, prefix, count)
        lat, hops = figures(db, prefix, int((start + WARMUP) * 1000))
        h = lambda k: f"{pct(hops[k], 0.99):.2f}"
        table.append(f"| {load}% | {rate:.2f} | {len(lat)} | {pct(lat, 0.5):.2f} s | {pct(lat, 0.9):.2f} s | "
                     f"{pct(lat, 0.99):.2f} s | {max(lat):.2f} s | {pct(hops['staged'], 0.5):.2f} / {h('staged')} s | "
                     f"{h('transform wait')} / {h('transform work')} s | {h('copy wait')} / {h('copy work')} s | "
                     f"{h('load wait')} / {h('load work')} s |")
        print(table[-1], flush=True)
        medians = ", ".join(f"{k} {pct(v, 0.5):.2f}" for k, v in hops.items())
        lines.append(f"{load}%: medians per hop (s): {medians}")

    # 3. idle
    time.sleep(5)
    a = cpu_ticks({s: p.pid for s, p in procs.items()})
    time.sleep(IDLE)
    b = cpu_ticks({s: p.pid for s, p in procs.items()})
    per = {s: (b[s] - a[s]) / tick / IDLE * 100 for s in STAGES}
    lines.append(f"idle, {IDLE:.0f} s: {sum(per.values()):.2f}% of one core in all ("
                 + ", ".join(f"{s} {v:.2f}%" for s, v in per.items()) + ")")
    print(lines[-1], flush=True)
    for s, p in procs.items():
        if p.poll() is not None:
            sys.exit(f"ferry-{s} exited during the run: see {DIR}/log.{s}")
    stores = "staging and table on two MiniDFS clusters" if os.environ.get("STORES") == "hdfs" else "local dirs"
    report = "\n".join([f"{stores}; stage flags: {' '.join(STAGE_ARGS) or '(defaults)'}; settle 0s; chunk_size 8MiB", "",
                        *table, "", *lines]) + "\n"
    print()
    print(report)
    if os.environ.get("OUT"):
        open(os.environ["OUT"], "w").write(report)
finally:
    for p in procs.values():
        p.terminate()
    for p in procs.values():
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
