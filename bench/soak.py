#!/usr/bin/env python3
"""A month unattended, compressed: Ferry's four stages run for a set time while files arrive
at a steady rate and a schedule of faults runs throughout; every minute the harness samples
what grows slowly (memory, file descriptors, threads, connections, the ledger, the stores),
and at the end it gives a verdict. Run through bench/soak.sh, which installs and starts what
a setup needs.

Setups:
  local   local dirs + a SQLite ledger; faults: kill -9 of a random stage, a source file
          rewritten, bad files
  s3      the table on the S3 test server behind a fault proxy + a Postgres ledger; faults as
          local, plus a destination outage (2 min), a storm of resets, hung and trickling
          connections, a Postgres restart and a minute down
  hdfs    staging on MiniDFS cluster B, the table on cluster A with its NameNode behind the
          fault proxy, a Postgres ledger; the same faults (the outage: a NameNode that accepts
          and never answers)

Modes: watch (the stages as --watch services, as systemd or Kubernetes run them) or once
(--once runs from a timer loop, as cron runs them). `ferry gc` and `ferry prune` run on a
schedule compressed as the month is.

Output in --out: samples.csv (one row a minute), events.csv (the faults, when), starts.json
(when each stage was started), soak.png (the charts, faults marked), verdict.md
(`bench/soak.py --reverdict DIR` takes a run's slopes again from its CSV files). Exit 0 only on a passing verdict:
  - the table holds every good record exactly once (digest against the inputs),
  - nothing quarantined but the bad files, no task left unfinished,
  - 0 open outages and no alert firing at the end (alerts checked with --prometheus),
  - every resource flat after the warm-up: its slope per hour (Theil-Sen: the median slope
    between two samples, robust to a fault's burst that falls back) within its bound,
  - no stage exited but the ones killed.
"""

import argparse
import csv
import datetime
import hashlib
import json
import os
import random
import shutil
import statistics
import signal
import sqlite3
import subprocess
import sys
import threading
import time

STAGES = ["ferry-extract", "ferry-transform", "ferry-copy", "ferry-load"]

# Slope bounds per hour after the warm-up: what a week would turn into an outage.
BOUNDS = {
    "rss_mib": 8.0,  # per stage
    "fds": 4.0,
    "threads": 4.0,
    "conns": 2.0,
}


def log(msg):
    print(f"[soak {datetime.datetime.now().strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now_ms():
    return int(time.time() * 1000)



HASH_MOD = 1 << 128


def row_hash(key):
    """A row's 128-bit hash. Summed mod 2^128 over a table it is a digest of the rows as a
    multiset: the same rows in any order give the same sum; a row missing, doubled or changed
    changes it (with the count compared too)."""
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=16).digest(), "big")

class Record:
    """One generated record; `good` unless its user_id is not a number."""

    def __init__(self, rng, tag, i, t_ms, bad=False):
        self.event_id = f"{tag}-{i:06d}"
        self.ts = t_ms
        self.host = f"h{rng.randrange(8)}"
        self.kind = rng.choice(["view", "click", "buy"])
        self.user_id = "x" if bad else rng.randrange(1 << 40)
        self.payload = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "eps"]) for _ in range(rng.randrange(3, 30)))
        self.score = None if rng.random() < 0.1 else round(rng.random() * 100, 3)
        self.good = not bad

    def iso(self):
        return datetime.datetime.fromtimestamp(self.ts / 1000, datetime.timezone.utc).isoformat().replace("+00:00", "Z")

    def key(self):
        return (self.event_id, self.ts, self.host, self.kind, int(self.user_id), self.payload, self.score)


def render(fmt, records):
    if fmt == "jsonl":
        return "".join(
            json.dumps({"event_id": r.event_id, "ts": r.iso(), "host": r.host, "kind": r.kind, "user_id": r.user_id, "payload": r.payload, "score": r.score})
            + "\n"
            for r in records
        ).encode()
    out = ["event_id,ts,host,kind,user_id,payload,score"]
    for r in records:
        out.append(f"{r.event_id},{r.iso()},{r.host},{r.kind},{r.user_id},{r.payload},{'' if r.score is None else r.score}")
    return ("\n".join(out) + "\n").encode()


class Proc:
    """A process of ours: a stage service, the fault proxy, Prometheus."""

    def __init__(self, name, argv, env, logdir, stdin=None):
        self.name, self.argv, self.env = name, argv, env
        self.logf = open(os.path.join(logdir, f"{name}.log"), "ab")
        self.p = subprocess.Popen(argv, env=env, stdout=self.logf, stderr=self.logf, stdin=stdin)


def proc_stats(pid, peers):
    """RSS (MiB), fds, threads, and TCP connections per peer port of `pid`."""
    try:
        status = open(f"/proc/{pid}/status").read()
        field = lambda name: int(next(l for l in status.splitlines() if l.startswith(name)).split()[1]) / 1024
        rss, anon = field("VmRSS:"), field("RssAnon:")
        fds = os.listdir(f"/proc/{pid}/fd")
        threads = len(os.listdir(f"/proc/{pid}/task"))
    except (FileNotFoundError, StopIteration, ProcessLookupError):
        return None
    # Each tokio runtime's reactor holds one eventfd: runtimes alive, with or without a thread
    # (an HDFS client's runtime is shut down when the client goes; its reactor stays while
    # anything registered with it lives).
    inodes, reactors = set(), 0
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
        elif link == "anon_inode:[eventfd]":
            reactors += 1
    conns = {name: 0 for name in peers}
    # Where the descriptors go, for a fds slope to be read by: TCP connections established to
    # anyone else (DataNodes, S3), TCP sockets the peer has closed and we have not (CLOSE_WAIT).
    other, close_wait = 0, 0
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            if f[9] not in inodes:
                continue
            if f[3] == "08":
                close_wait += 1
            if f[3] != "01":
                continue
            port = int(f[2].rsplit(":", 1)[1], 16)
            mine = [name for name, p in peers.items() if port == p]
            for name in mine:
                conns[name] += 1
            other += not mine
    return {
        "rss_mib": rss, "anon_mib": anon, "fds": len(fds), "threads": threads, "conns": conns,
        "sockets": len(inodes), "tcp_other": other, "close_wait": close_wait, "reactors": reactors,
    }


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dir_usage(path):
    n = b = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                b += os.lstat(os.path.join(root, f)).st_size
                n += 1
            except OSError:
                pass
    return n, b


def theil_sen(lives):
    """The median of the slopes between every two samples of the same life, per hour of the
    minutes given: the Theil-Sen estimator. A storm of resets or an outage raises connections,
    threads and memory for its minutes and then they fall back; a least-squares line through a
    life with such bursts says more about where the faults fell than about a leak, and a count
    that steps once by one (a thread) tilts it by a bound's worth. What leaks grows between most
    pairs of samples, so it moves the median."""
    pairs = [(v2 - v1) / ((t2 - t1) / 60) for pts in lives for i, (t1, v1) in enumerate(pts) for t2, v2 in pts[i + 1:] if t2 > t1]
    return statistics.median(pairs) if pairs else 0.0


def slope_checks(samples, starts, warm):
    """The resources' slopes after the warm-up (`warm` minutes; an HDFS stage's client pool
    fills for minutes), and a check per bounded one. A stage killed and started again warms up
    again, and a line across the restart would measure the restart: slopes are taken within
    each life that has 5 samples past its warm-up (`starts`: stage -> the minutes it was
    started at). Returns (checks, slopes (Theil-Sen, bounded), least-squares slopes of the
    longest life (reported beside))."""
    slopes, fitted, checks = {}, {}, []
    for key in samples[0]:
        if not key.endswith(("_rss_mib", "_anon_mib", "_fds", "_threads", "_conns")) and key != "ledger_bytes":
            continue
        pts = [(float(s["t_min"]), float(s[key])) for s in samples if s[key] != "" and float(s["t_min"]) >= warm]
        stage = f"ferry-{key.split('_', 1)[0]}"
        lives = {}
        for t, v in pts:
            began = max((b for b in starts.get(stage, [0.0]) if b <= t), default=0.0)
            if t - began >= warm or stage not in starts:
                lives.setdefault(began, []).append((t, v))
        lives = [life for life in lives.values() if len(life) >= 5]
        if lives:
            slopes[key] = theil_sen(lives)
            longest = max(lives, key=len)
            fitted[key] = fit_slope([p[0] / 60 for p in longest], [p[1] for p in longest])
    for key, slope in sorted(slopes.items()):
        kind = key.split("_", 1)[1]
        if kind in BOUNDS:
            # Growth is what a week turns into an outage; a resource that shrinks is fine.
            checks.append((f"{key} flat", slope <= BOUNDS[kind], f"{slope:+.2f}/h (bound +{BOUNDS[kind]}/h)"))
    return checks, slopes, fitted


def fit_slope(xs, ys):
    """Least-squares slope of ys over xs (per unit of xs)."""
    n = len(xs)
    if n < 3:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return 0.0 if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.dir = os.path.abspath(a.dir)
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        for d in ("in", "staging", "spool", "wh", "logs", "textfile"):
            os.makedirs(os.path.join(self.dir, d))
        os.makedirs(a.out, exist_ok=True)
        self.bin = os.path.abspath(a.bin)
        # file name -> (records, sum of their hashes) of the version the table must show: a
        # multiset digest, so a two-hour run's ten million rows are never held in memory.
        self.expected = {}
        self.bad_sent = 0
        self.files = 0
        self.events = []  # (t_s, what)
        self.kills = 0
        self.unexpected_exits = []
        self.services = {}
        self.starts = {}  # stage -> the minutes it was (re)started at
        self.proxy = None
        self.proxy_gen = 0
        self.prom = None
        self.final_alerts = []
        self.t0 = time.time()
        self.peers = {}
        self.pg = None
        self.config = os.path.join(self.dir, "ferry.toml")
        self.env = dict(os.environ, FERRY_CONFIG=self.config, RUST_LOG="warn")
        self.env.pop("FERRY_LEDGER", None)
        self.write_config()

    # --- setup -----------------------------------------------------------------------------

    def write_config(self):
        d, a = self.dir, self.a
        ledger = f"sqlite://{d}/ledger.db"
        destination = f'[destination]\nurl = "{d}/wh"\n'
        staging = f'[staging]\nurl = "file://{d}/staging"\n'
        self.prefix = f"soak-{int(time.time())}"
        if a.setup in ("s3", "hdfs"):
            e = os.environ
            # A database of the run's own: the counts and the verdict see only this run.
            db = self.prefix.replace("-", "_")
            r = subprocess.run(["psql", "-X", "-q", "-d", e["FERRY_TEST_POSTGRES"], "-c", f"CREATE DATABASE {db}"], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"cannot create the run's ledger database: {r.stderr}")
            ledger = e["FERRY_TEST_POSTGRES"].rsplit("/", 1)[0] + "/" + db
            self.ledger_url = ledger
            self.pg = (e["FERRY_PG_DIR"], e["FERRY_PG_PORT"])
            self.peers["postgres"] = int(e["FERRY_PG_PORT"])
            # The destination (S3, or cluster A's NameNode) behind the fault proxy.
            dest = e["FERRY_TEST_S3_ENDPOINT"] if a.setup == "s3" else e["FERRY_TEST_HDFS_A"]
            target = dest.split("//")[1].rstrip("/")
            self.proxy = subprocess.Popen(
                [os.path.join(self.bin, "faultproxy"), target, "--seed", str(a.seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(d, "logs", "proxy.log"), "ab"), text=True,
            )
            listen = self.proxy.stdout.readline().split()[1]
            self.peers["s3" if a.setup == "s3" else "namenode_a"] = int(listen.rsplit(":", 1)[1])
        if a.setup == "hdfs":
            # Staging on cluster B (the source side), the table on cluster A through the proxy.
            staging = f'[staging]\nurl = "{e["FERRY_TEST_HDFS_B"]}/{self.prefix}-staging"\n[staging.store]\ncall_timeout = "10s"\n'
            self.peers["namenode_b"] = int(e["FERRY_TEST_HDFS_B"].rsplit(":", 1)[1])
            destination = f'[destination]\nurl = "hdfs://{listen}/{self.prefix}"\n[destination.store]\ncall_timeout = "5s"\nread_stall = "5s"\n'
        if a.setup == "s3":
            destination = (
                f'[destination]\nurl = "s3://{e["FERRY_TEST_S3_BUCKET"]}/{self.prefix}"\n'
                '[destination.store]\ncall_timeout = "5s"\nread_stall = "5s"\n'
                f'[destination.store.s3]\nendpoint = "https://{listen}"\nregion = "us-east-1"\npath_style = true\n'
                f'ca_bundle = "{e["FERRY_TEST_S3_CA"]}"\naccess_key_id = "{e["FERRY_TEST_S3_ACCESS_KEY"]}"\n'
                f'secret_access_key = "{e["FERRY_TEST_S3_SECRET_KEY"]}"\nconnect_timeout = "1s"\nrequest_timeout = "10s"\n'
                'read_timeout = "3s"\nmax_retries = 2\nretry_timeout = "5s"\n'
            )
        text = f"""[ledger]
url = "{ledger}"
lease = "20s"
backoff_min = "500ms"
backoff_max = "10s"

[source]
url = "{d}/in"
settle = "1s"
# Sources that grow for ever make every tool's listing (and extract's memory) grow with them;
# deployments that run for weeks move files away once taken, so the soak does too.
disposition = "delete"

{staging}
[spool]
dir = "{d}/spool"

{destination}
[table]
name = "events"
partition_by = ["dt"]
columns = [
  {{ name = "event_id", type = "string", nullable = false }},
  {{ name = "ts", type = "timestamp", nullable = false }},
  {{ name = "host", type = "string", nullable = false }},
  {{ name = "kind", type = "string", nullable = false }},
  {{ name = "user_id", type = "long", nullable = false }},
  {{ name = "payload", type = "string", nullable = false }},
  {{ name = "score", type = "double" }},
]

[extract]
chunk_size = "256KiB"

[transform]
derive = {{ dt = "date(ts)" }}
max_bad_records = 0
"""
        open(self.config, "w").write(text)
        if self.pg:
            self.ferry(["migrate"], check=True)

    def ferry(self, args, check=False):
        r = subprocess.run([os.path.join(self.bin, "ferry")] + args, env=self.env, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise SystemExit(f"ferry {' '.join(args)}: {r.returncode}: {r.stderr}")
        return r

    def start(self, stage, port):
        self.starts.setdefault(stage, []).append((time.time() - self.t0) / 60)
        argv = [os.path.join(self.bin, stage), "--watch", "--poll", "1s", "--metrics-addr", f"127.0.0.1:{port}"]
        env = dict(self.env, RUST_LOG="info")
        self.services[stage] = (Proc(stage, argv, env, os.path.join(self.dir, "logs")), port)

    def start_prometheus(self):
        if not shutil.which("prometheus"):
            log("prometheus not installed: alerts are not checked")
            return
        rules = os.path.join(self.a.repo, "deploy/prometheus/alerts.yml")
        targets = ", ".join(f'"127.0.0.1:{p}"' for _, p in self.services.values())
        cfg = os.path.join(self.dir, "prometheus.yml")
        open(cfg, "w").write(
            f"global:\n  scrape_interval: 10s\n  evaluation_interval: 10s\nrule_files: [\"{rules}\"]\n"
            f"scrape_configs:\n  - job_name: ferry\n    static_configs:\n      - targets: [{targets}]\n"
        )
        self.prom_port = free_port()
        argv = ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={self.dir}/prom", f"--web.listen-address=127.0.0.1:{self.prom_port}"]
        self.prom = Proc("prometheus", argv, os.environ, os.path.join(self.dir, "logs"))

    def alerts_firing(self):
        if not self.prom:
            return []
        try:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/api/v1/alerts", timeout=5) as r:
                data = json.load(r)
            return sorted({a["labels"]["alertname"] for a in data["data"]["alerts"] if a["state"] == "firing"})
        except Exception:
            return ["(prometheus did not answer)"]

    # --- arrivals --------------------------------------------------------------------------

    def arrive(self, name=None, bad_file=False):
        """A new file (or a new version of `name`), written to a temp name and renamed in."""
        self.files += 1
        fmt = self.rng.choice(["jsonl", "csv"])
        if name is None:
            name = f"f{self.files:06d}.{fmt}"
        else:
            fmt = name.rsplit(".", 1)[1]
        tag = f"{name}-{self.files}"
        n = self.rng.choice([20, 200, 2000])
        base = now_ms() - self.rng.randrange(3 * 86400_000)
        if bad_file:
            # gzip bytes under a text name: quarantined whole, with its reason.
            data = b"\x1f\x8b\x08\x00" + os.urandom(64)
            self.bad_sent += 1
            self.expected.pop(name, None)
        else:
            records = [Record(self.rng, tag, i, base + i * 1000) for i in range(n)]
            data = render(fmt, records)
            self.expected[name] = (len(records), sum(row_hash(r.key()) for r in records) % HASH_MOD)
        tmp = os.path.join(self.dir, "in", f".{name}.part")
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(self.dir, "in", name))

    # --- faults ----------------------------------------------------------------------------

    def event(self, what):
        t = time.time() - self.t0
        self.events.append((round(t, 1), what))
        log(f"fault: {what}")

    def kill_one(self):
        if self.a.mode != "watch":
            return
        stage = self.rng.choice(STAGES)
        proc, port = self.services[stage]
        self.event(f"kill -9 {stage}")
        self.kills += 1
        proc.p.send_signal(signal.SIGKILL)
        proc.p.wait()
        self.start(stage, port)

    def proxy_faults(self, line, what, secs):
        """Faults on the destination's connections for `secs`; a later fault ends an earlier one."""
        if self.proxy:
            self.event(what)
            self.proxy_gen += 1
            gen = self.proxy_gen
            self.proxy.stdin.write(line + "\ncut\n")
            self.proxy.stdin.flush()
            self.later(secs, lambda: self.heal_proxy(gen))

    def heal_proxy(self, gen):
        if self.proxy and gen == self.proxy_gen:
            self.event("store healed")
            self.proxy.stdin.write("clear\n")
            self.proxy.stdin.flush()

    def pg_ctl(self, *args):
        d, port = self.pg
        pg_bin = sorted(p for p in os.listdir("/usr/lib/postgresql"))[-1]
        as_pg = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={d} -c max_connections=200"
        subprocess.run(as_pg + [f"/usr/lib/postgresql/{pg_bin}/bin/pg_ctl", "-D", f"{d}/data", "-l", f"{d}/log", "-w", "-t", "60", "-o", opts] + list(args),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def schedule(self, minutes):
        """(second, action) pairs: the fault schedule, spread over the run, the last fault ending
        at least `--quiet` minutes before the end."""
        end = (minutes - self.a.quiet) * 60
        acts = []
        period = max(end / 6, 60)
        t = 30.0
        kinds = ["kill", "rewrite", "kill", "bad"]
        if self.a.setup in ("s3", "hdfs"):
            kinds += ["outage", "resets", "hangs", "postgres"]
        i = 0
        while t < end - 30:
            acts.append((t, kinds[i % len(kinds)]))
            t += period / 2 * (0.6 + 0.8 * self.rng.random())
            i += 1
        return acts

    def fault(self, kind):
        if kind == "kill":
            self.kill_one()
        elif kind == "rewrite":
            names = sorted(self.expected)
            if names:
                name = self.rng.choice(names)
                self.event(f"{name} rewritten")
                self.arrive(name)
        elif kind == "bad":
            self.event("a corrupt file arrives")
            self.arrive(bad_file=True)
        elif kind == "outage":
            self.proxy_faults("--hang 1", "destination outage (2 min): every connection hangs", 120)
        elif kind == "resets":
            self.proxy_faults("--reset 0.5 --reset-within 24576 --reset-any-byte", "storm of resets (1 min)", 60)
        elif kind == "hangs":
            self.proxy_faults("--hang 0.3 --trickle 0.2", "hung handshakes and trickles (1 min)", 60)
        elif kind == "postgres":
            self.event("postgres stopped (1 min)")
            self.pg_ctl("-m", "fast", "stop")

            def back():
                self.event("postgres started")
                self.pg_ctl("start")

            self.later(60, back)

    def later(self, secs, f):
        t = threading.Timer(secs, f)
        t.daemon = True
        t.start()
        self.timers.append(t)

    # --- samples ---------------------------------------------------------------------------

    def sql(self, q):
        if self.pg:
            r = subprocess.run(["psql", "-X", "-q", "-t", "-A", "-d", self.ledger_url, "-c", q], capture_output=True, text=True)
            return r.stdout.strip() if r.returncode == 0 else None
        try:
            c = sqlite3.connect(f"file:{self.dir}/ledger.db?mode=ro", uri=True, timeout=10)
            row = c.execute(q).fetchone()
            c.close()
            return "" if row is None or row[0] is None else str(row[0])
        except sqlite3.Error:
            return None

    def ledger_bytes(self):
        if self.pg:
            v = self.sql("SELECT pg_database_size(current_database())")
            return int(v) if v else 0
        return sum(os.path.getsize(os.path.join(self.dir, f)) for f in os.listdir(self.dir) if f.startswith("ledger.db"))

    def sample(self):
        t = time.time() - self.t0
        row = {"t_min": round(t / 60, 2)}
        for stage in STAGES:
            proc, _ = self.services.get(stage, (None, None))
            s = proc_stats(proc.p.pid, self.peers) if proc and self.a.mode == "watch" else None
            short = stage.split("-")[1]
            row[f"{short}_rss_mib"] = round(s["rss_mib"], 1) if s else ""
            # The heap alone: RSS also counts mapped files (the ledger's WAL index, binaries).
            row[f"{short}_anon_mib"] = round(s["anon_mib"], 1) if s else ""
            row[f"{short}_fds"] = s["fds"] if s else ""
            row[f"{short}_threads"] = s["threads"] if s else ""
            row[f"{short}_conns"] = sum(s["conns"].values()) if s else ""
            for peer in self.peers:
                row[f"{short}_conns_{peer}"] = s["conns"][peer] if s else ""
            for k in ("sockets", "tcp_other", "close_wait", "reactors"):
                row[f"{short}_{k}"] = s[k] if s else ""
        row["ledger_bytes"] = self.ledger_bytes()
        for table in ("source_files", "chunks", "tasks", "attempts", "published", "outages"):
            v = self.sql(f"SELECT COUNT(*) FROM {table}")
            row[f"rows_{table}"] = v if v is not None else ""
        for d in ("staging", "spool"):
            n, b = dir_usage(os.path.join(self.dir, d))
            row[f"{d}_files"], row[f"{d}_bytes"] = n, b
        if self.a.setup == "local":
            n, b = dir_usage(os.path.join(self.dir, "wh", "_ferry"))
            row["ferry_meta_files"], row["ferry_meta_bytes"] = n, b
        v = self.sql("SELECT COUNT(*) FROM outages WHERE ended_at IS NULL")
        row["open_outages"] = v if v is not None else ""
        row["alerts_firing"] = " ".join(self.alerts_firing())
        since = now_ms() - 60_000
        lat = self.sql(
            "SELECT string_agg(CAST(t.finalized_at - f.mtime_ms AS TEXT), ',') FROM tasks t JOIN chunks c ON c.id = t.chunk_id "
            f"JOIN source_files f ON f.id = c.file_id WHERE t.stage = 'load' AND t.state = 'done' AND t.finalized_at > {since}"
            if self.pg
            else "SELECT group_concat(t.finalized_at - f.mtime_ms) FROM tasks t JOIN chunks c ON c.id = t.chunk_id "
            f"JOIN source_files f ON f.id = c.file_id WHERE t.stage = 'load' AND t.state = 'done' AND t.finalized_at > {since}"
        )
        xs = sorted(int(x) for x in lat.split(",") if x) if lat else []
        row["latency_p50_s"] = round(xs[len(xs) // 2] / 1000, 2) if xs else ""
        row["latency_p99_s"] = round(xs[min(len(xs) - 1, int(len(xs) * 0.99))] / 1000, 2) if xs else ""
        rec = self.sql(f"SELECT SUM(records) FROM tasks WHERE stage = 'load' AND state = 'done' AND finalized_at > {since}")
        row["records_per_s"] = round(int(rec) / 60, 1) if rec else 0
        row["files_sent"] = self.files
        return row

    # --- the run ---------------------------------------------------------------------------

    def run_once_round(self):
        for stage in STAGES:
            r = subprocess.run([os.path.join(self.bin, stage), "--once", "--metrics-textfile", os.path.join(self.dir, "textfile")],
                               env=self.env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "logs", f"{stage}.log"), "ab"))
            if r.returncode not in (0, 3, 4, 5):
                self.unexpected_exits.append(f"{stage} --once exited {r.returncode}")

    def run(self):
        a = self.a
        self.timers = []
        if a.mode == "watch":
            for stage in STAGES:
                self.start(stage, free_port())
            self.start_prometheus()
        acts = self.schedule(a.minutes)
        end = self.t0 + a.minutes * 60
        next_file = self.t0
        next_sample = self.t0 + 5
        next_gc, next_prune, next_round = self.t0 + a.gc_every * 60, self.t0 + a.prune_every * 60, self.t0
        samples = []
        while time.time() < end:
            now = time.time()
            arrivals_end = end - 60 * arrival_stop(a.quiet)
            while next_file <= now and now < arrivals_end:
                self.arrive(bad_file=self.rng.random() < 0.02)
                next_file += 1.0 / a.rate
            while acts and acts[0][0] <= now - self.t0:
                self.fault(acts.pop(0)[1])
            if now >= next_gc:
                r = self.ferry(["gc"])
                # gc may fail while a store is down (it says so and is run again); not otherwise.
                if r.returncode != 0 and self.a.setup == "local":
                    self.unexpected_exits.append(f"ferry gc exited {r.returncode}: {r.stderr.strip()[-300:]}")
                self.events.append((round(now - self.t0, 1), f"gc (exit {r.returncode})"))
                next_gc += a.gc_every * 60
            if now >= next_prune:
                r = self.ferry(["prune", "--older-than", f"{int(a.prune_every * 60)}s"])
                if r.returncode != 0:
                    self.unexpected_exits.append(f"ferry prune exited {r.returncode}: {r.stderr.strip()[-300:]}")
                self.events.append((round(now - self.t0, 1), f"prune (exit {r.returncode})"))
                next_prune += a.prune_every * 60
            if a.mode == "once" and now >= next_round:
                self.run_once_round()
                next_round = time.time() + 15
            if a.mode == "watch":
                for stage, (proc, port) in list(self.services.items()):
                    if proc.p.poll() is not None:
                        self.unexpected_exits.append(f"{stage} exited {proc.p.returncode} at {round((now - self.t0) / 60, 1)} min")
                        self.start(stage, port)
            if now >= next_sample:
                samples.append(self.sample())
                log(f"sample at {samples[-1]['t_min']} min: {samples[-1]['files_sent']} files, "
                    f"ledger {samples[-1]['ledger_bytes'] >> 10} KiB, p50 {samples[-1]['latency_p50_s']} s, alerts: {samples[-1]['alerts_firing'] or 'none'}")
                next_sample += a.sample_every
            time.sleep(0.05)
        # Drained: the stages keep running until nothing is due twice in a row (at most 5 more
        # minutes); arrivals stopped a while before the end, so every file is registered.
        t_drain, quiet = time.time(), 0
        while time.time() - t_drain < 300 and quiet < 2:
            if a.mode == "once":
                self.run_once_round()
            open_tasks = self.sql("SELECT COUNT(*) FROM tasks WHERE state NOT IN ('done', 'quarantined')")
            unchunked = self.sql("SELECT COUNT(*) FROM source_files WHERE state = 'registered'")
            quiet = quiet + 1 if (open_tasks, unchunked) == ("0", "0") else 0
            time.sleep(5)
        samples.append(self.sample())
        # Asked now, while Prometheus still scrapes the services.
        self.final_alerts = self.alerts_firing()
        return samples

    def shutdown(self):
        for t in getattr(self, "timers", []):
            t.cancel()
        for stage, (proc, _) in self.services.items():
            proc.p.send_signal(signal.SIGTERM)
        for stage, (proc, _) in self.services.items():
            try:
                rc = proc.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.p.kill()
                rc = "killed after 60 s"
            # 3: quarantined work waits in the ledger (the bad files), a clean stop all the same.
            if rc not in (0, 3):
                self.unexpected_exits.append(f"{stage} ended {rc} on SIGTERM")
        if self.prom:
            self.prom.p.terminate()
        if self.proxy:
            self.proxy.stdin.close()
            self.proxy.wait()

    # --- the verdict -----------------------------------------------------------------------

    def table_rows(self):
        """(rows, multiset digest) of the published table."""
        import pyarrow.dataset as ds

        fs, path = None, os.path.join(self.dir, "wh", "events")
        if self.a.setup == "s3":
            import pyarrow.fs as pfs

            e = os.environ
            fs = pfs.S3FileSystem(access_key=e["FERRY_TEST_S3_ACCESS_KEY"], secret_key=e["FERRY_TEST_S3_SECRET_KEY"],
                                  endpoint_override=e["FERRY_TEST_S3_ENDPOINT"].split("//")[1], scheme="https", region="us-east-1",
                                  tls_ca_file_path=e["FERRY_TEST_S3_CA"])
            path = f"{e['FERRY_TEST_S3_BUCKET']}/{self.prefix}/events"
        if self.a.setup == "hdfs":
            # Read back with Hadoop's own client (FsShell -get), straight from cluster A.
            path = os.path.join(self.dir, "table-copy")
            nn = os.environ["FERRY_TEST_HDFS_A"]
            r = subprocess.run(["bash", "-c", '. scripts/minidfs.sh && ferry_fsshell -fs "$0" -get "$1" "$2"', nn, f"/{self.prefix}/events", path],
                               cwd=self.a.repo, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"reading the table back from HDFS: {r.stderr[-2000:]}")
        if fs is None and not os.path.exists(path):
            # Nothing published (yet): an empty table, which the verdict holds against what was sent.
            return 0, 0
        # Batch by batch: (rows, sum of row hashes), the same multiset digest as the input's.
        n, total = 0, 0
        for batch in ds.dataset(path, filesystem=fs, format="parquet", partitioning="hive").to_batches():
            for r in batch.to_pylist():
                ts = r["ts"]
                ms = int(ts.timestamp() * 1000) if isinstance(ts, datetime.datetime) else int(ts)
                total += row_hash((r["event_id"], ms, r["host"], r["kind"], int(r["user_id"]), r["payload"], r["score"]))
                n += 1
        return n, total % HASH_MOD

    def verdict(self, samples):
        checks = []
        got = self.table_rows()
        want = (sum(n for n, _ in self.expected.values()), sum(h for _, h in self.expected.values()) % HASH_MOD)
        digest = lambda d: f"{d[1]:032x}"[:16]
        checks.append(("the table holds every good record exactly once",
                       got == want, f"{got[0]} rows (digest {digest(got)}), {want[0]} expected (digest {digest(want)})"))
        checks.append(("good records were sent at all", want[0] > 0, f"{len(self.expected)} good file(s) sent"))
        q_files = self.sql("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'")
        q_tasks = self.sql("SELECT COUNT(*) FROM tasks WHERE state = 'quarantined'")
        open_tasks = self.sql("SELECT COUNT(*) FROM tasks WHERE state NOT IN ('done', 'quarantined')")
        ok = q_tasks == "0" and open_tasks == "0" and q_files is not None and int(q_files) <= self.bad_sent
        checks.append(("nothing quarantined but the bad files, nothing left unfinished", ok,
                       f"{q_files} files quarantined ({self.bad_sent} bad ones sent), {q_tasks} tasks quarantined, {open_tasks} unfinished"))
        last = samples[-1]
        checks.append(("no open outage at the end", last["open_outages"] == "0", f"{last['open_outages']} open"))
        if self.prom:
            # FerryQuarantined is right to fire while the bad files sent wait for an operator.
            firing = [f for f in self.final_alerts if not (f == "FerryQuarantined" and ok)]
            shown = " ".join(self.final_alerts) or "none"
            checks.append(("no alert firing at the end (but FerryQuarantined for the bad files)", not firing, shown))
        checks.append(("no stage exited but the ones killed, no gc or prune failed", not self.unexpected_exits,
                       f"{self.kills} killed; unexpected: {'; '.join(self.unexpected_exits) or 'none'}"))
        warm = max(10.0, self.a.minutes * 0.2)
        slope_rows, slopes, self.raw_slopes = slope_checks(samples, self.starts, warm)
        checks += slope_rows
        chunks = self.sql("SELECT COUNT(*) FROM chunks")
        per_chunk = last["ledger_bytes"] / max(1, int(chunks or 0))
        return checks, slopes, per_chunk, chunks

    def write(self, samples, checks, slopes, per_chunk, chunks):
        out = self.a.out
        keys = list(samples[0].keys())
        with open(os.path.join(out, "samples.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(samples)
        with open(os.path.join(out, "events.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "event"])
            w.writerows(self.events)
        json.dump(self.starts, open(os.path.join(out, "starts.json"), "w"))
        summary = (f"{self.files} files sent at {self.a.rate}/s, {chunks} chunks; ledger {samples[-1]['ledger_bytes'] >> 10} KiB at the end, "
                   f"{per_chunk:.0f} bytes per chunk.")
        passed = write_verdict(out, f"{self.a.setup}, {self.a.mode}, {self.a.minutes} min", summary, checks, slopes, self.raw_slopes)
        try:
            self.chart(samples)
        except ImportError:
            log("matplotlib is not installed: no charts")
        return passed

    def chart(self, samples):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = [s["t_min"] for s in samples]
        fig, ax = plt.subplots(4, 1, figsize=(11, 14), sharex=True)
        num = lambda k: [float(s[k]) if s[k] != "" else float("nan") for s in samples]
        for stage in STAGES:
            short = stage.split("-")[1]
            ax[0].plot(t, num(f"{short}_rss_mib"), label=f"{short} RSS MiB")
            ax[0].plot(t, num(f"{short}_fds"), "--", label=f"{short} fds")
            ax[0].plot(t, num(f"{short}_conns"), ":", label=f"{short} TCP")
        ax[0].set_title("resources per stage")
        ax[1].plot(t, [s["ledger_bytes"] / 1024 for s in samples], label="ledger KiB")
        for table in ("chunks", "tasks", "attempts", "published"):
            ax[1].plot(t, num(f"rows_{table}"), label=f"{table} rows")
        ax[1].set_title("ledger growth")
        ax[2].plot(t, num("latency_p50_s"), label="p50 landing -> published (s)")
        ax[2].plot(t, num("latency_p99_s"), label="p99 (s)")
        ax[2].set_title("latency")
        ax[3].plot(t, num("records_per_s"), label="records/s published")
        ax[3].set_title("throughput")
        ax[3].set_xlabel("minutes")
        for a in ax:
            for ts, what in self.events:
                if not what.startswith(("gc", "prune")):
                    a.axvline(ts / 60, color="red", alpha=0.25)
            a.legend(fontsize=7, loc="upper left")
        fig.suptitle(f"Ferry soak: {self.a.setup}, {self.a.mode}, {self.a.minutes} min (red: faults)")
        fig.tight_layout()
        fig.savefig(os.path.join(self.a.out, "soak.png"), dpi=80)


def write_verdict(out, title, summary, checks, slopes, fitted):
    passed = all(c[1] for c in checks)
    lines = [f"# Soak: {title} ({'PASS' if passed else 'FAIL'})", "", summary, "", "| check | ok | detail |", "|---|---|---|"]
    lines += [f"| {name} | {'yes' if ok else '**no**'} | {detail} |" for name, ok, detail in checks]
    lines += ["", "Slopes after the warm-up, per hour: Theil-Sen over every life (bounded), and a least-squares line over the longest life:", ""]
    lines += [f"- {k}: {v:+.2f} (fitted {fitted.get(k, 0.0):+.2f})" for k, v in sorted(slopes.items())]
    open(os.path.join(out, "verdict.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return passed


def reverdict(out):
    """The slope checks of a finished run again, from its samples.csv and events.csv (and
    starts.json, or the kills in events.csv): what a change to the bounds or the estimator says
    about runs already made. The other checks are kept as the run wrote them."""
    samples = list(csv.DictReader(open(os.path.join(out, "samples.csv"))))
    path = os.path.join(out, "starts.json")
    if os.path.exists(path):
        starts = json.load(open(path))
    else:
        starts = {stage: [0.0] for stage in STAGES}
        for e in csv.DictReader(open(os.path.join(out, "events.csv"))):
            if e["event"].startswith("kill -9 "):
                starts.setdefault(e["event"][len("kill -9 "):], [0.0]).append(float(e["t_s"]) / 60)
    old = open(os.path.join(out, "verdict.md")).read().splitlines()
    title = old[0].split("Soak: ", 1)[1].rsplit(" (", 1)[0]
    minutes = float(title.split(", ")[2].split()[0])
    kept = []
    for line in old:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("check",) and not cells[0].endswith(" flat"):
            kept.append((cells[0], cells[1] == "yes", cells[2]))
    checks, slopes, fitted = slope_checks(samples, starts, max(10.0, minutes * 0.2))
    return write_verdict(out, title, old[2], kept + checks, slopes, fitted)


def arrival_stop(quiet):
    """Minutes before the end at which files stop arriving: the last faults end `quiet` minutes
    before it, and the last files then get a minute or more to drain through healed stores."""
    return max(1.0, quiet - 1)


def main():
    if sys.argv[1:2] == ["--reverdict"]:
        sys.exit(0 if reverdict(sys.argv[2]) else 1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setup", choices=["local", "s3", "hdfs"], default="local")
    p.add_argument("--mode", choices=["watch", "once"], default="watch")
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--rate", type=float, default=2.0, help="files a second")
    p.add_argument("--quiet", type=float, default=None,
                   help="minutes without faults at the end (default: 5, or a quarter of a run shorter than 20 minutes)")
    p.add_argument("--sample-every", type=float, default=60, help="seconds")
    p.add_argument("--gc-every", type=float, default=10, help="minutes")
    p.add_argument("--prune-every", type=float, default=15, help="minutes (and prune's --older-than)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bin", help="directory of Ferry's binaries (and faultproxy)")
    p.add_argument("--repo")
    p.add_argument("--dir", default="/tmp/ferry-soak")
    p.add_argument("--out")
    p.add_argument("--check", action="store_true", help="only check the options (soak.sh does, before it builds)")
    a = p.parse_args()
    if a.quiet is None:
        a.quiet = min(5.0, a.minutes / 4)
    # Files stop arriving `arrival_stop` minutes before the end (see Soak.run): a run no longer
    # than that would send nothing and have nothing to judge.
    if a.minutes - arrival_stop(a.quiet) < 1:
        p.error(f"--minutes {a.minutes:g} is too short for --quiet {a.quiet:g}: files stop arriving "
                f"{arrival_stop(a.quiet):g} minute(s) before the end, so give at least "
                f"{arrival_stop(a.quiet) + 1:g} minutes" + (" or a shorter --quiet" if a.quiet > 2 else ""))
    if a.check:
        return
    for need in ("bin", "repo", "out"):
        if getattr(a, need) is None:
            p.error(f"--{need} is required")
    s = Soak(a)
    try:
        samples = s.run()
    finally:
        s.shutdown()
    checks, slopes, per_chunk, chunks = s.verdict(samples)
    sys.exit(0 if s.write(samples, checks, slopes, per_chunk, chunks) else 1)


if __name__ == "__main__":
    main()
