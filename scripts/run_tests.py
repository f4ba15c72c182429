#!/usr/bin/env python3
"""Runs the workspace's test binaries side by side, longest first, and prints each one's time.

Most of Ferry's integration binaries wait (for a MiniDFS JVM to start, for an outage to end, for a
lease to expire) more than they compute, so running a few at once fills the two cores that one
binary at a time leaves idle. cargo test runs binaries one after another; this does what it does
for each (the binary, in its package's directory, with cargo's run-time variables) but several at
a time.

  cargo test --no-run --message-format=json ... | scripts/run_tests.py --jobs 3 --threads 4 \
      --history FILE --log-dir DIR [--first LABEL]... [--beside LABEL]... [--only LABEL]... [-- HARNESS ARGS]

A binary's label is PKG::TEST for an integration test (ferry-tests::delta), PKG::lib for a crate's
unit tests, PKG::bin-NAME for a binary's.

Order: the longest binaries of the history file (or, for a binary it lacks, of the --known table
kept in the repository) first, a binary in neither counting as long, so the run does not end
waiting for one long binary started last. A binary named by --beside (one that sleeps through
most of its run: the ten-minute outage) runs at once in a slot of its own, beside the --jobs
others, instead of holding one of them idle. Every binary runs even after one fails;
the failures' whole output is printed at the end, then a table of every binary's time. The times
are appended to the history file (tab-separated: date, binary, seconds, result).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--jobs", type=int, default=3)
p.add_argument("--threads", type=int, default=4)
p.add_argument("--history", required=True)
p.add_argument("--known", help="a markdown table of earlier times (| binary | seconds | ...), for binaries the history lacks")
p.add_argument("--log-dir", required=True)
p.add_argument("--first", action="append", default=[], help="binaries started before any other")
p.add_argument("--beside", action="append", default=[],
               help="binaries that mostly sleep: started at once, each in a slot beside the --jobs others")
p.add_argument("--only", action="append", default=[],
               help="run only these binaries, and the unit tests of every crate (PKG::lib, PKG::bin-NAME)")
p.add_argument("harness", nargs="*")
args = p.parse_args()

jobs = []
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m.get("profile", {}).get("test"):
        continue
    pkg = m["package_id"]
    # package_id: "path+file:///.../load#ferry-load@0.1.0" (or the older "name version (source)")
    name = pkg.split("#")[-1].split("@")[0] if "#" in pkg else pkg.split()[0]
    kind = m["target"]["kind"][0]
    target = m["target"]["name"]
    label = f"{name}::{target}" if kind in ("test", "bench") else f"{name}::lib" if kind == "lib" else f"{name}::{kind}-{target}"
    manifest_dir = os.path.dirname(m["manifest_path"])
    jobs.append({"label": label, "exe": m["executable"], "cwd": manifest_dir, "pkg": name})

if not jobs:
    sys.exit("run_tests.py: no test binaries on stdin (did the build fail?)")
if args.only:
    missing = set(args.only) - {j["label"] for j in jobs}
    if missing:
        # A renamed or deleted binary must not drop out of a tier unnoticed.
        sys.exit(f"run_tests.py: no test binary {', '.join(sorted(missing))}")
    jobs = [j for j in jobs if j["label"] in args.only or j["label"].endswith("::lib") or "::bin-" in j["label"]]

history = {}
if args.known and os.path.exists(args.known):
    # A fresh machine has no history of its own: the times kept in the repository order its run.
    for line in open(args.known):
        f = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(f) >= 2 and "::" in f[0]:
            try:
                history[f[0]] = float(f[1].split()[0])
            except (ValueError, IndexError):
                pass
if os.path.exists(args.history):
    for line in open(args.history):
        f = line.rstrip("\n").split("\t")
        if len(f) >= 3:
            try:
                history[f[1]] = float(f[2])  # the newest entry wins
            except ValueError:
                pass
jobs.sort(key=lambda j: (j["label"] not in args.first, -history.get(j["label"], 1e9), j["label"]))

os.makedirs(args.log_dir, exist_ok=True)
lock = threading.Lock()
queue = list(jobs)
results = []
t_start = time.monotonic()


def run(job):
    log = os.path.join(args.log_dir, job["label"].replace("::", "__") + ".log")
    env = dict(os.environ, CARGO_MANIFEST_DIR=job["cwd"], CARGO_PKG_NAME=job["pkg"])
    t0 = time.monotonic()
    with open(log, "wb") as out:
        child = subprocess.Popen([job["exe"], f"--test-threads={args.threads}", *args.harness],
                                 cwd=job["cwd"], env=env, stdout=out, stderr=subprocess.STDOUT)
        # wait4: the binary's CPU time and that of every process it waited for (its stages,
        # Python readers, JVMs it stopped). On two cores the suite's wall is bounded below by
        # the sum of these over two: the column that says which binary to make cheaper.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = rc = os.waitstatus_to_exitcode(status)
    secs = time.monotonic() - t0
    cpu = usage.ru_utime + usage.ru_stime
    summary = ""
    for line in open(log, errors="replace"):
        if line.startswith("test result:"):
            summary = line.strip()
    with lock:
        results.append((job, rc, secs, log, cpu))
        print(f"[{time.monotonic() - t_start:7.1f}s] {'ok  ' if rc == 0 else 'FAIL'} {job['label']} "
              f"{secs:.1f}s (cpu {cpu:.0f}s) {summary}", flush=True)


def worker():
    while True:
        with lock:
            if not queue:
                return
            job = queue.pop(0)
        run(job)


beside = [j for j in queue if j["label"] in args.beside]
queue = [j for j in queue if j["label"] not in args.beside]
threads = [threading.Thread(target=run, args=(j,)) for j in beside]
threads += [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
for t in threads:
    t.start()
for t in threads:
    t.join()

wall = time.monotonic() - t_start
failed = [r for r in results if r[1] != 0]
for job, rc, secs, log, _ in failed:
    print(f"\n===== {job['label']} failed (exit {rc}); its output:", flush=True)
    sys.stdout.write(open(log, errors="replace").read())
print(f"\n===== test binaries by time ({len(results)} binaries, {args.jobs} at a time, wall {wall:.0f} s)")
stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
with open(args.history, "a") as h:
    for job, rc, secs, log, cpu in sorted(results, key=lambda r: -r[2]):
        print(f"{secs:8.1f} s  cpu {cpu:7.1f} s  {'ok  ' if rc == 0 else 'FAIL'}  {job['label']}")
        h.write(f"{stamp}\t{job['label']}\t{secs:.1f}\t{'ok' if rc == 0 else 'fail'}\t{cpu:.1f}\n")
    h.write(f"{stamp}\t(wall)\t{wall:.1f}\t{'ok' if not failed else 'fail'}\n")
total_cpu = sum(r[4] for r in results)
print(f"{wall:8.1f} s  wall; cpu {total_cpu:.0f} s in all")
sys.exit(1 if failed else 0)
