//! Ledger benchmark: claim + complete cycles per second.
//!
//! `ledger-bench --ledger URL --workers N --batch B --tasks T` seeds T tasks, then N concurrent
//! workers claim B at a time and complete each (one transaction per claim, one per complete,
//! each complete writing the attempt history and the next stage's task, as the stages do).
//!
//! For several hosts on one ledger (`bench/scaleout.sh`): `--phase seed` only seeds, then one
//! `--phase work` per host claims and completes until nothing is left.

use std::time::{Duration, Instant};

use clap::Parser;
use ferry_ledger::{Ledger, LedgerOptions, Stage, Work};

#[derive(Parser, Debug)]
struct Args {
    /// sqlite://PATH or postgres://... (a fresh database is best).
    #[arg(long)]
    ledger: String,
    #[arg(long, default_value_t = 4)]
    workers: usize,
    #[arg(long, default_value_t = 1)]
    batch: i64,
    #[arg(long, default_value_t = 20_000)]
    tasks: i64,
    /// all (seed, then work), seed or work.
    #[arg(long, default_value = "all", value_parser = ["all", "seed", "work"])]
    phase: String,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let opts =
        LedgerOptions { max_connections: args.workers as u32 + 2, reclaim_interval: Duration::from_secs(5), ..LedgerOptions::default() };
    let ledger = Ledger::connect(&args.ledger, opts).await.expect("connect");
    let run = format!("{:x}", std::process::id() as u64 ^ ledger.now_ms() as u64);

    let t = Instant::now();
    let per_file = 1000;
    let seed = args.phase != "work";
    for f in 0..if seed { (args.tasks + per_file - 1) / per_file } else { 0 } {
        let n = per_file.min(args.tasks - f * per_file);
        ferry_ledger::testing::seed(&ledger, &format!("bench/{run}/{f}"), n).await;
    }
    let seeded = t.elapsed();
    if args.phase == "seed" {
        println!("backend={} tasks={} seed={:.2}s", ledger.backend_name(), args.tasks, seeded.as_secs_f64());
        return;
    }

    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..args.workers {
        let ledger = ledger.clone();
        let batch = args.batch;
        workers.push(tokio::spawn(async move {
            let me = format!("bench-{}-{w}", std::process::id());
            let mut done = 0u64;
            loop {
                let leases = ledger.claim(Stage::Transform, &me, batch).await.expect("claim");
                if leases.is_empty() {
                    return done;
                }
                for l in leases {
                    ledger.complete(&l, Work::new(1000, 100)).await.expect("complete");
                    done += 1;
                }
            }
        }));
    }
    let mut cycles = 0;
    for w in workers {
        cycles += w.await.unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "backend={} workers={} batch={} tasks={} seed={:.2}s cycles={} elapsed={:.2}s cycles_per_sec={:.0}",
        ledger.backend_name(),
        args.workers,
        args.batch,
        args.tasks,
        seeded.as_secs_f64(),
        cycles,
        secs,
        cycles as f64 / secs
    );
}
