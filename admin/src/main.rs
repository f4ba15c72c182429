//! `ferry`: the admin binary. Migrate and inspect the ledger, requeue quarantined work.

use clap::{Parser, Subcommand};
use ferry_admin::Error;
use ferry_admin::sample::{AvroCodec, Payload};
use ferry_admin::status;
use ferry_common::cli::{self, CommonArgs, exit};
use ferry_common::config::{Config, Format, LedgerUrl, redact_url};
use ferry_common::error::ConfigError;
use ferry_common::paths;
use ferry_ledger::{Ledger, LedgerOptions, RequeueFilter, Stage};
use ferry_storage::Store;

/// Administer a Ferry work ledger.
///
/// The ledger is plain SQL: besides these commands you can query its views directly
/// (backlog, stuck_leases, recent_failures, redone_work, throughput).
const ADMIN_HELP: &str = "\
Exit codes:
  0  done
  1  fatal: the ledger or a store could not be used
  2  bad flags, configuration or ledger URL (also: a ledger that does not exist, except for migrate)
  3  status: something is quarantined
  status --check uses Nagios codes instead: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN

Environment:
  FERRY_LEDGER       the ledger URL (--ledger)
  FERRY_CONFIG       the configuration file (--config of status, check-config, gc)
  FERRY_LOG_FORMAT   text or json (--log-format)
  RUST_LOG           log filter (default info)";

#[derive(Parser, Debug)]
#[command(name = "ferry", version = ferry_ledger::VERSION, about, long_about = None, after_help = ADMIN_HELP)]
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
    /// Summarize the ledger: per stage the chunks and bytes pending, running, retrying and
    /// quarantined, the age of the oldest due task, the last success, the rate over the last
    /// five minutes and an ETA; stuck leases with their owner; the latest errors.
    ///
    /// Exits 3 when something is quarantined (0 otherwise); with --check, Nagios codes.
    Status {
        /// Read the ledger URL from this configuration (else --ledger / FERRY_LEDGER).
        #[arg(long, env = "FERRY_CONFIG")]
        config: Option<std::path::PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Print again every INTERVAL (e.g. 5s) until interrupted.
        #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "5s", value_parser = humantime::parse_duration)]
        watch: Option<std::time::Duration>,
        /// Nagios-style check: one line, exit 0 OK, 1 WARNING (stuck leases, work due longer
        /// than --max-age), 2 CRITICAL (anything quarantined), 3 UNKNOWN (no ledger).
        #[arg(long, conflicts_with_all = ["json", "watch"])]
        check: bool,
        /// With --check: how long due work may wait before it is a warning.
        #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
        max_age: std::time::Duration,
    },
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
    if let Cmd::Status { config, json, watch, check, max_age } = &cli.cmd {
        let url = match (&cli.common.ledger, config) {
            (Some(url), _) => url.clone(),
            (None, Some(config)) => Config::load(config)?.ledger.url,
            (None, None) => cli::DEFAULT_LEDGER.to_string(),
        };
        let ledger = match existing_ledger(&url).await {
            Ok(l) => l,
            Err(e) if *check => {
                println!("FERRY UNKNOWN - {e}");
                return Ok(status::check::UNKNOWN);
            }
            Err(e) => return Err(e),
        };
        return status_command(&ledger, &redact_url(&url), *json, *watch, check.then_some(*max_age)).await;
    }
    let url = cli.common.ledger.clone().unwrap_or_else(|| cli::DEFAULT_LEDGER.to_string());
    match cli.cmd {
        Cmd::Migrate => {
            let ledger = Ledger::connect(&url, LedgerOptions::default()).await?;
            println!("ledger {} ({}) is migrated", redact_url(&url), ledger.backend_name());
        }
        Cmd::CheckConfig { .. } | Cmd::Gen { .. } | Cmd::Status { .. } => unreachable!("handled before connecting"),
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
            // Only `migrate` (and the stages) create a ledger: a typo in a URL must not leave
            // an empty ledger behind and report "requeued 0".
            let ledger = existing_ledger(&url).await?;
            let n = ledger.requeue(&RequeueFilter { stage, chunk_id: chunk }).await?;
            println!("requeued {n} task(s)");
        }
    }
    Ok(exit::OK)
}

/// Connects to a ledger that must exist already (an SQLite file that is not there is an error,
/// not a new empty ledger).
async fn existing_ledger(url: &str) -> Result<Ledger, Error> {
    if let LedgerUrl::Sqlite(path) = LedgerUrl::parse(url)?
        && !path.exists()
    {
        return Err(ConfigError::new(
            format!("ledger URL {:?}", redact_url(url)),
            format!("{} does not exist; create it with `ferry migrate` or point --ledger / --config at the right one", path.display()),
        )
        .into());
    }
    Ok(Ledger::connect(url, LedgerOptions::default()).await?)
}

/// `ferry status`: the table, JSON, or a Nagios line; `--watch` repeats the first two.
async fn status_command(
    ledger: &Ledger,
    url: &str,
    json: bool,
    watch: Option<std::time::Duration>,
    check: Option<std::time::Duration>,
) -> Result<i32, Error> {
    use std::io::IsTerminal;
    loop {
        let o = ledger.overview(ferry_ledger::observe::RATE_WINDOW).await?;
        if let Some(max_age) = check {
            let (code, line) = status::verdict(&o, max_age);
            println!("{line}");
            return Ok(code);
        }
        let parts = ledger.table_partitions().await?;
        let shown = if json {
            serde_json::to_string_pretty(&status::to_json(&o, url, &parts)).unwrap_or_default()
        } else {
            status::text(&o, url, &parts)
        };
        let Some(every) = watch else {
            println!("{}", shown.trim_end());
            let quarantined = !o.quarantined.is_empty();
            return Ok(if quarantined { exit::QUARANTINED } else { exit::OK });
        };
        if std::io::stdout().is_terminal() && !json {
            print!("\x1b[2J\x1b[H"); // clear the screen, like watch(1)
        }
        println!("{}", shown.trim_end());
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(exit::OK),
        }
    }
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
