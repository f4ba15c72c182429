//! `ferry`: the admin binary. Migrate and inspect the ledger, requeue quarantined work.

use clap::{Parser, Subcommand};
use ferry_admin::Error;
use ferry_admin::sample::{AvroCodec, Payload};
use ferry_common::cli::{self, CommonArgs, exit};
use ferry_common::config::{Config, Format};
use ferry_common::error::ConfigError;
use ferry_common::paths;
use ferry_ledger::{Ledger, LedgerOptions, RequeueFilter, Stage, TaskState};
use ferry_storage::Store;

/// Administer a Ferry work ledger.
///
/// The ledger is plain SQL: besides these commands you can query its views directly
/// (backlog, stuck_leases, recent_failures, redone_work, throughput).
#[derive(Parser, Debug)]
#[command(name = "ferry", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the ledger (if SQLite) and apply pending migrations. Safe to run concurrently.
    Migrate,
    /// Summarize the ledger: files, backlog per stage and state, stuck leases, redone work.
    Status,
    /// Print the resolved configuration (file + FERRY_* environment), or say what is wrong.
    CheckConfig {
        /// The TOML file shared by all stages.
        #[arg(long, env = "FERRY_CONFIG")]
        config: std::path::PathBuf,
    },
    /// Write deterministic sample events (as in seed 000: 200 B to 1 KB records).
    Gen {
        /// avro, jsonl or csv.
        #[arg(long, default_value = "avro")]
        format: String,
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: std::path::PathBuf,
        #[arg(long, default_value_t = 4)]
        files: u64,
        /// Records per file.
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Avro block codec.
        #[arg(long, value_enum, default_value = "null")]
        codec: AvroCodec,
        /// Records per Avro block.
        #[arg(long, default_value_t = 1000)]
        block_records: usize,
        /// Payload text: words (compresses like logs or JSON) or letters (random, the worst
        /// case for a codec).
        #[arg(long, value_enum, default_value = "words")]
        payload: Payload,
    },
    /// Remove what crashed writers left behind: temp files in staging, the destination's
    /// `_ferry/tmp` and the table (HDFS files possibly still under construction), spool temp
    /// files, and abandoned S3 multipart uploads. Only what is older than copy.deadline plus two leases (or
    /// `--older-than`) goes, so running writers are never disturbed.
    Gc {
        #[arg(long, env = "FERRY_CONFIG")]
        config: std::path::PathBuf,
        /// Age instead of copy.deadline plus two leases, e.g. "1h".
        #[arg(long)]
        older_than: Option<humantime::Duration>,
    },
    /// Send quarantined tasks back to `available` with a fresh attempt budget.
    Requeue {
        /// Only tasks of this stage (transform, copy, load).
        #[arg(long)]
        stage: Option<Stage>,
        /// Only this chunk.
        #[arg(long)]
        chunk: Option<String>,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    cli::init_logging(cli.common.log_format);
    cli::exit_with(run(cli).await)
}

async fn run(cli: Cli) -> Result<i32, Error> {
    match &cli.cmd {
        Cmd::CheckConfig { config } => {
            let mut cfg = Config::load(config)?;
            if let Some(url) = &cli.common.ledger {
                cfg.ledger.url = url.clone();
            }
            print!("{}", cfg.to_toml());
            return Ok(exit::OK);
        }
        Cmd::Gen { format, out, files, records, seed, codec, block_records, payload } => {
            gen_files(format, out, *files, *records, *seed, *codec, *block_records, *payload)?;
            return Ok(exit::OK);
        }
        _ => {}
    }
    let url = cli.common.ledger.clone().unwrap_or_else(|| cli::DEFAULT_LEDGER.to_string());
    let ledger = Ledger::connect(&url, LedgerOptions::default()).await?;
    match cli.cmd {
        Cmd::Migrate => {
            println!("ledger {url} ({}) is migrated", ledger.backend_name());
        }
        Cmd::Status => {
            let st = ledger.status().await?;
            println!("ledger: {url}");
            println!("source files:");
            if st.files.is_empty() {
                println!("  (none)");
            }
            for (state, n) in &st.files {
                println!("  {:<12} {n:>8}", state.as_str());
            }
            println!("tasks:");
            println!("  {:<10} {:<12} {:>8} {:>14}", "stage", "state", "tasks", "bytes");
            for r in &st.backlog {
                println!("  {:<10} {:<12} {:>8} {:>14}", r.stage.as_str(), r.state.as_str(), r.tasks, r.bytes);
            }
            let parts = ledger.table_partitions().await?;
            if !parts.is_empty() {
                println!("published:");
                for p in &parts {
                    println!("  {}/{:<24} {:>5} files {:>10} rows", p.table, p.partition, p.files, p.records);
                }
            }
            for q in ledger.quarantined().await? {
                println!("quarantined {} {}: {}", q.kind, q.what, q.reason.unwrap_or_default());
            }
            println!("stuck leases: {}", st.stuck_leases);
            println!("redone attempts: {} ({} bytes)", st.redone_attempts, st.redone_bytes);
            let quarantined = st.tasks(None, TaskState::Quarantined);
            if quarantined > 0 {
                println!("{quarantined} task(s) quarantined: see `SELECT * FROM recent_failures`, then `ferry requeue`");
            }
        }
        Cmd::CheckConfig { .. } | Cmd::Gen { .. } => unreachable!("handled before connecting"),
        Cmd::Gc { config, older_than } => {
            let cfg = Config::load(&config)?;
            let cutoff = match older_than {
                Some(d) => chrono::Utc::now().timestamp_millis() - std::time::Duration::from(d).as_millis() as i64,
                // A live writer is at most a copy deadline into its file, plus two leases.
                None => cfg.temp_cutoff_ms(chrono::Utc::now().timestamp_millis()),
            };
            let table = &cfg.table.name;
            let staging = Store::open(&cfg.staging.url, &cfg.staging.store)?;
            let dest = Store::open(&cfg.destination.url, &cfg.destination.store)?;
            let spool = Store::from_url(&cfg.spool.dir.to_string_lossy())?;
            // Each place on its own: one store that is down does not stop the others' cleanup.
            let (mut n, mut failed) = (0, 0);
            for (what, r) in [
                ("staging", staging.remove_stale_temps(table, cutoff).await),
                ("destination temp files and uploads", dest.gc(paths::COPY_TEMP_DIR, cutoff).await),
                ("destination table metadata", dest.remove_stale_temps(&paths::table_meta(table), cutoff).await),
                ("spool", spool.remove_stale_temps(table, cutoff).await),
            ] {
                match r {
                    Ok(k) => n += k,
                    Err(e) => {
                        failed += 1;
                        eprintln!("gc of {what} failed: {e}");
                    }
                }
            }
            println!("removed {n} abandoned file(s) or upload(s)");
            if failed > 0 {
                return Ok(exit::FATAL);
            }
        }
        Cmd::Requeue { stage, chunk } => {
            let n = ledger.requeue(&RequeueFilter { stage, chunk_id: chunk }).await?;
            println!("requeued {n} task(s)");
        }
    }
    Ok(exit::OK)
}

#[allow(clippy::too_many_arguments)] // one per `ferry gen` flag
fn gen_files(
    format: &str,
    out: &std::path::Path,
    files: u64,
    records: usize,
    seed: u64,
    codec: AvroCodec,
    block_records: usize,
    payload: Payload,
) -> Result<(), Error> {
    let fmt = Format::parse(format).ok_or_else(|| ConfigError::new("--format", format!("unknown format {format:?} (avro, jsonl, csv)")))?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out.display(), e))?;
    // 2026-11-28T00:00:00Z, so the events fall into a few `dt` partitions.
    let start_ms = 1_795_824_000_000;
    for i in 0..files {
        let path = out.join(format!("events-{seed}-{i:04}.{}", fmt.as_str()));
        let tmp = out.join(format!(".events-{seed}-{i:04}.tmp"));
        let f = std::fs::File::create(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
        let mut w = std::io::BufWriter::new(f);
        let file_seed = seed.wrapping_mul(1_000_003).wrapping_add(i);
        let events = ferry_admin::sample::events_with(file_seed, records, start_ms + i as i64 * 3_600_000, payload);
        ferry_admin::sample::write_events(&mut w, fmt, events, codec, block_records)
            .and_then(|_| std::io::Write::flush(&mut w))
            .map_err(|e| Error::io(tmp.display(), e))?;
        // Whole files only: a reader polling `out` never sees a half-written one.
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(path.display(), e))?;
        println!("{}", path.display());
    }
    Ok(())
}
