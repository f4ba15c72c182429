//! `ferry`: the admin binary. Migrate and inspect the ledger, requeue quarantined work.

use clap::{Parser, Subcommand};
use ferry_admin::Error;
use ferry_admin::sample::{AvroCodec, Payload};
use ferry_admin::{doctor, status};
use ferry_common::cli::{self, CommonArgs, exit};
use ferry_common::error::ConfigError;
use ferry_ledger::{Ledger, LedgerOptions, RequeueFilter, Stage};
use ferry_runtime::config::{Config, Format, LedgerUrl, Versions, redact_url};
use ferry_runtime::sweeps::{Places, Sweep};
use ferry_storage::Store;

/// Administer a Ferry work ledger.
///
/// The ledger is plain SQL: besides these commands you can query its views directly
/// (backlog, pipeline_backlog, stuck_leases, recent_failures, redone_work, throughput,
/// quarantined, table_partitions, open_outages).
const ADMIN_HELP: &str = "\
Exit codes:
  0  done
  1  fatal: the ledger or a store could not be used
  2  bad flags, configuration or ledger URL (also: a ledger that does not exist, except for migrate)
  3  status: something is quarantined; verify: the table differs from the ledger
  status --check uses Nagios codes instead: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN

Environment:
  FERRY_LEDGER       the ledger URL (--ledger)
  FERRY_CONFIG       the configuration file (--config); its ledger.url is the ledger
  FERRY_PIPELINE     the pipeline to act on (--pipeline; default: the config's)
  FERRY_LOG_FORMAT   text or json (--log-format)
  RUST_LOG           log filter (default info)";

#[derive(Parser, Debug)]
#[command(name = "ferry", version = ferry_ledger::version(), about, long_about = None, after_help = ADMIN_HELP)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// The configuration file shared by all stages: its `ledger.url` is the ledger every
    /// command uses (unless --ledger / FERRY_LEDGER says otherwise); check-config and gc
    /// need it.
    #[arg(long, env = "FERRY_CONFIG", global = true)]
    config: Option<std::path::PathBuf>,
    /// The pipeline to report on or act on (default: the config's `pipeline`, else
    /// "default"). Several pipelines may share one ledger; each command sees one.
    #[arg(long, env = "FERRY_PIPELINE", global = true)]
    pipeline: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the ledger (if SQLite) and apply pending migrations. Safe to run concurrently.
    Migrate {
        /// Only say what would run and whether binaries of the ledger's current schema keep
        /// running after it; change nothing.
        #[arg(long)]
        check: bool,
    },
    /// Summarize the ledger: per stage the chunks and bytes pending, running, retrying and
    /// quarantined, the age of the oldest due task, the last success, the rate over the last
    /// five minutes and an ETA; stuck leases with their owner; the latest errors.
    ///
    /// Exits 3 when something is quarantined (0 otherwise); with --check, Nagios codes.
    Status {
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
    CheckConfig,
    /// Write shell completions for the five Ferry binaries into --out, each under the name
    /// the shell finds it by (bash: `ferry.bash`, zsh: `_ferry`, fish: `ferry.fish`, ...).
    /// deploy/install.sh installs bash's and zsh's.
    Completions {
        shell: clap_complete::Shell,
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Write man pages (section 1) into --out: the five binaries and each `ferry` subcommand
    /// (`ferry-status.1`, ...). deploy/install.sh installs them.
    Man {
        #[arg(long)]
        out: std::path::PathBuf,
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
        /// Mean time between two events, in milliseconds. The default puts ~300k events in a
        /// day; a larger gap spreads each file (and each chunk of it) over more `dt` partitions.
        #[arg(long, default_value_t = ferry_admin::sample::DEFAULT_GAP_MS)]
        gap_ms: u64,
    },
    /// Remove what crashed writers left behind (temp files in staging, the destination's
    /// `_ferry/tmp` and the table, spool temp files, abandoned multipart uploads) and what
    /// finished work no longer needs (spool directories of copied chunks, landed copies of
    /// published chunks, staged chunks past transform.keep_staged), as named sweeps. Only what
    /// is older than copy.deadline plus two leases (or `--older-than`) goes, so running writers
    /// are never disturbed.
    Gc {
        /// Age instead of copy.deadline plus two leases, e.g. "1h".
        #[arg(long)]
        older_than: Option<humantime::Duration>,
        /// Only this sweep (repeatable): staging-temps, abandoned-uploads, table-meta-temps,
        /// spool-temps, spent-spool, stray-landed, old-staged. Default: all of them.
        #[arg(long = "sweep", value_name = "NAME", value_parser = parse_sweep)]
        sweeps: Vec<Sweep>,
    },
    /// Send quarantined work back with a fresh attempt budget: tasks (all, of a stage, of a
    /// chunk) or a source file (after fixing what made it fail, e.g. source.format).
    Requeue {
        /// Only tasks of this stage (transform, copy, load).
        #[arg(long)]
        stage: Option<Stage>,
        /// Only this chunk.
        #[arg(long)]
        chunk: Option<String>,
        /// A source file, by its URI or its path below the source: the file is extracted
        /// again if it was quarantined, and its chunks' quarantined tasks are requeued.
        #[arg(long, conflicts_with_all = ["stage", "chunk"])]
        file: Option<String>,
        /// Say what would be requeued, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run a chunk again from a stage on, even where that stage is done (a spool or landed
    /// file lost, a published file deleted by hand): the stage's task becomes available and
    /// each later stage runs again after it. Load replaces the chunk's published files.
    /// `--from transform` needs the staged chunk, `copy` the spool file, `load` the landed one.
    Rerun {
        #[arg(long, required_unless_present = "spool_node", conflicts_with = "spool_node")]
        chunk: Option<String>,
        /// Every chunk waiting for a copy on this spool node (a host that is gone for good,
        /// its spool with it): each is transformed again wherever a transform runs. Needs
        /// `--from transform`.
        #[arg(long)]
        spool_node: Option<String>,
        /// transform, copy or load.
        #[arg(long)]
        from: Stage,
        /// Say what would run again, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Give up on a chunk for good: its unfinished tasks become `skipped` with the reason,
    /// kept in the ledger; nothing of it is published later. `ferry rerun` undoes it. A load
    /// whose parts are in the table already is refused (exit 2): it only has to record them.
    /// Needs --config: it looks at the table.
    Skip {
        #[arg(long)]
        chunk: String,
        /// Why (kept in the ledger and shown by `ferry status`).
        #[arg(long)]
        reason: String,
        /// Say what would be skipped, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Compare the table on the destination with what the ledger says this pipeline
    /// published: files missing, of the wrong size, or there without the ledger knowing. For a
    /// Delta table (table_format = "delta"), the ledger against the files the table's latest
    /// version names, each of which must be on the store at its size. Exits 3 when anything
    /// differs.
    Verify {
        /// Run the chunks of missing or wrong files again from transform (their staged copy
        /// must still be there: transform.keep_staged).
        #[arg(long)]
        requeue: bool,
    },
    /// Delta tables: delete the files that the table's commits removed more than RETAIN ago,
    /// which only readers of older versions (time travel) still read. Files the latest
    /// version names are never touched. Needs --config.
    Vacuum {
        /// How long removed files stay for readers of older versions; at least the table's
        /// `delta.deletedFileRetentionDuration` (default 1 week) unless --allow-short-retention.
        #[arg(long, value_parser = humantime::parse_duration)]
        retain: Option<std::time::Duration>,
        /// Take a RETAIN shorter than the table's retention (readers of versions within it
        /// then fail on the deleted files).
        #[arg(long)]
        allow_short_retention: bool,
        /// Say what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delta tables: merge each partition's small files (under TARGET_SIZE) into files of up
    /// to TARGET_SIZE, one commit per merge. Row groups are copied whole (no value is decoded
    /// again); a later rerun, switch or skip of a merged chunk rewrites the merged file
    /// without it. The merged files leave the directory with `ferry vacuum`. Needs --config.
    Compact {
        /// Files under this size are merged, into files of up to this size.
        #[arg(long, default_value = "128MiB", value_parser = parse_size)]
        target_size: u64,
        /// Say what would be merged, write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Can Ferry reach everything this configuration names, with its settings? For the
    /// ledger and each store (source, archive, staging, spool, destination) it connects with
    /// the configured auth and TLS, lists, and (where Ferry writes) writes a probe file under
    /// `_ferry/`, reads it back and compares its hash, renames it and deletes it. One line per
    /// hop (ok or FAILED, latency, the failed step and its error, the likely fix); exits 1
    /// when any hop fails. The source is only listed unless `disposition` removes files from
    /// it. Run it before enabling the timers, and after any change. Needs --config.
    Doctor {
        /// Print JSON (`{"ok": .., "hops": [{"hop", "url", "ok", "ms", "steps", "error",
        /// "fix"}]}`) instead of lines.
        #[arg(long)]
        json: bool,
        /// The deadline of each step (a store that accepts and never answers fails the hop).
        #[arg(long, default_value = "20s")]
        timeout: humantime::Duration,
    },
    /// Move this pipeline's SQLite ledger (--ledger, FERRY_LEDGER or the config's) into a new
    /// Postgres ledger, every pipeline in it: stop every stage first, run `ferry migrate` on
    /// the Postgres URL, move, then point `[ledger] url` (or FERRY_LEDGER) at it and start the
    /// stages again. All rows go in one transaction; the SQLite file is kept as it was and
    /// marked moved, so a stage that still names it is refused. Refused while a stage holds a
    /// live lease, or when the target holds rows. Run again after an interruption.
    MoveLedger {
        /// The Postgres ledger to move into (migrated, empty).
        #[arg(long)]
        to: String,
    },
    /// Delete history older than a retention: attempts of finished tasks, the transform and
    /// copy tasks of published chunks, closed outages, chunk notes. Kept: every source file,
    /// chunk, part, reject and published row, and each chunk's load task, so that re-running
    /// any stage afterwards publishes nothing twice.
    Prune {
        /// The retention, e.g. "30d".
        #[arg(long)]
        older_than: humantime::Duration,
        /// Count what would go, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    cli::init_logging(cli.common.log_format);
    cli::exit_with(run(cli).await)
}

/// The command lines of the five binaries: `ferry` and the four stages.
fn commands() -> Vec<clap::Command> {
    let mut all = vec![<Cli as clap::CommandFactory>::command()];
    all.extend(cli::STAGES.iter().map(|(name, _)| cli::stage_command(name, ferry_ledger::version())));
    all
}

async fn run(cli: Cli) -> Result<i32, Error> {
    let config = || {
        cli.config
            .as_deref()
            .ok_or_else(|| ConfigError::new("--config", "this command needs the configuration file (--config or FERRY_CONFIG)"))
    };
    match &cli.cmd {
        Cmd::CheckConfig => {
            let mut cfg = Config::load(config()?)?;
            if let Some(url) = &cli.common.ledger {
                cfg.ledger.url = url.clone();
            }
            print!("{}", cfg.to_toml());
            return Ok(exit::OK);
        }
        Cmd::Doctor { json, timeout } => {
            let mut cfg = Config::load(config()?)?;
            if let Some(url) = &cli.common.ledger {
                cfg.ledger.url = url.clone();
            }
            let pipeline = cli.pipeline.clone().unwrap_or_else(|| cfg.pipeline.clone());
            // Boxed: the hops' futures nest deep enough to overflow the compiler's layout limit in `run`.
            let hops = Box::pin(doctor::run(&cfg, &cfg.ledger.url, &pipeline, (*timeout).into())).await;
            if *json {
                println!("{}", serde_json::to_string_pretty(&doctor::json(&hops)).unwrap_or_default());
            } else {
                print!("{}", doctor::text(&hops));
            }
            return Ok(if hops.iter().all(|h| h.ok) { exit::OK } else { exit::FATAL });
        }
        Cmd::Gen { format, out, files, records, seed, codec, block_records, payload, gap_ms } => {
            gen_files(format, out, *files, *records, *seed, *codec, *block_records, (*payload, *gap_ms))?;
            return Ok(exit::OK);
        }
        Cmd::Completions { shell, out } => {
            for mut c in commands() {
                let name = c.get_name().to_string();
                let path = clap_complete::generate_to(*shell, &mut c, &name, out)
                    .map_err(|e| ConfigError::new("--out", format!("{}: {e}", out.display())))?;
                println!("wrote {}", path.display());
            }
            return Ok(exit::OK);
        }
        Cmd::Man { out } => {
            for c in commands() {
                clap_mangen::generate_to(c, out).map_err(|e| ConfigError::new("--out", format!("{}: {e}", out.display())))?;
            }
            println!("wrote the man pages of ferry, its subcommands and the four stages into {}", out.display());
            return Ok(exit::OK);
        }
        _ => {}
    }
    // The ledger: --ledger / FERRY_LEDGER, else the config's, else the default file.
    let cfg = cli.config.as_deref().map(Config::load).transpose()?;
    let url = match (&cli.common.ledger, &cfg) {
        (Some(url), _) => url.clone(),
        (None, Some(cfg)) => cfg.ledger.url.clone(),
        (None, None) => cli::DEFAULT_LEDGER.to_string(),
    };
    let pipeline =
        cli.pipeline.clone().or_else(|| cfg.as_ref().map(|c| c.pipeline.clone())).unwrap_or_else(|| ferry_ledger::DEFAULT_PIPELINE.into());
    let existing_ledger = |url: &str| {
        let (url, pipeline) = (url.to_string(), pipeline.clone());
        async move { existing_ledger(&url).await.map(|l| l.with_pipeline(&pipeline)) }
    };
    if let Cmd::Status { json, watch, check, max_age } = &cli.cmd {
        let ledger = match existing_ledger(&url).await {
            Ok(l) => l,
            Err(e) if *check => {
                println!("FERRY UNKNOWN - {e}");
                return Ok(status::check::UNKNOWN);
            }
            Err(e) => return Err(e),
        };
        // What a partition's table version is: an Iceberg table's are snapshot ids.
        let label = match cfg.as_ref().map(|c| c.destination.table_format) {
            Some(ferry_runtime::config::TableFormat::Iceberg) => "snapshot",
            _ => "table version",
        };
        return status_command(&ledger, &redact_url(&url), *json, *watch, check.then_some(*max_age), label).await;
    }
    match cli.cmd {
        Cmd::Migrate { check: true } => print!("{}", Ledger::check_schema(&url).await?),
        Cmd::Migrate { check: false } => {
            // A migration rewrites indexes of the whole ledger: not bounded by the 10 s a
            // stage's statement may take.
            let long = std::time::Duration::from_secs(3600);
            let opts = LedgerOptions { migrate: true, lock_timeout: long, call_timeout: long, ..LedgerOptions::default() };
            let ledger = Ledger::connect(&url, opts).await?;
            println!("ledger {} ({}) is migrated", redact_url(&url), ledger.backend_name());
        }
        Cmd::CheckConfig | Cmd::Doctor { .. } | Cmd::Gen { .. } | Cmd::Status { .. } | Cmd::Completions { .. } | Cmd::Man { .. } => {
            unreachable!("handled before connecting")
        }
        Cmd::MoveLedger { to } => {
            let moved = ferry_ledger::move_ledger(&url, &to, chrono::Utc::now().timestamp_millis()).await?;
            if moved.already {
                println!("the rows were copied by an earlier run; the SQLite ledger is now marked moved");
            }
            for (table, n) in &moved.rows {
                if *n > 0 {
                    println!("{table}: {n} rows");
                }
            }
            println!(
                "moved {} to {}; {} says so beside it. Point [ledger] url (or FERRY_LEDGER) at the new ledger, then start the stages.",
                redact_url(&url),
                redact_url(&to),
                moved.note.display()
            );
        }
        Cmd::Gc { older_than, sweeps } => {
            let cfg = Config::load(config()?)?;
            return gc(&cfg, &url, older_than.map(Into::into), &sweeps).await;
        }
        // Only `migrate` (and the stages) create a ledger: a typo in a URL must not leave an
        // empty ledger behind and report "requeued 0".
        Cmd::Requeue { stage, chunk, file, dry_run } => {
            let ledger = existing_ledger(&url).await?;
            let verb = if dry_run { "would requeue" } else { "requeued" };
            if let Some(file) = file {
                let source = cfg.as_ref().map(|c| Store::open(&c.source.url, &c.source.store)).transpose()?;
                // A path below the source names the same file as its URI.
                let uri = source.map(|s| if file.contains("://") { file.clone() } else { s.url(&file) }).unwrap_or(file);
                let (files, tasks) = ledger.requeue_file(&uri, dry_run).await?;
                if files == 0 && tasks == 0 {
                    return Err(
                        ConfigError::new("--file", format!("{uri}: no quarantined source file or chunk of it in the ledger")).into()
                    );
                }
                durable(&ledger, dry_run).await?;
                println!("{verb} {files} source file(s) and {tasks} task(s) of {uri}");
            } else {
                let n = ledger.requeue_tasks(&RequeueFilter { stage, chunk_id: chunk }, dry_run).await?;
                durable(&ledger, dry_run).await?;
                println!("{verb} {n} task(s)");
            }
        }
        Cmd::Rerun { chunk, spool_node, from, dry_run } => {
            let ledger = existing_ledger(&url).await?;
            let verb = if dry_run { "would run" } else { "will run" };
            let chunks = match (chunk, spool_node) {
                (Some(chunk), _) => {
                    let plan = ledger.rerun(&chunk, from, dry_run).await?;
                    durable(&ledger, dry_run).await?;
                    println!("chunk {chunk} {verb} again: {}", plan_text(&plan));
                    return Ok(exit::OK);
                }
                (None, Some(node)) => {
                    if from != Stage::Transform {
                        return Err(ConfigError::new("--from", "--spool-node needs --from transform: the spool's Parquet is gone").into());
                    }
                    let chunks = ledger.copies_waiting_on(&node).await?;
                    println!("pipeline {}: {} chunk(s) wait for a copy on spool node {node:?}", ledger.pipeline(), chunks.len());
                    chunks
                }
                (None, None) => unreachable!("clap requires --chunk or --spool-node"),
            };
            // Each chunk on its own: one that cannot run again (it became running meanwhile)
            // does not keep the others back; the exit code says some did not.
            let mut failed = 0;
            let mut done = Vec::new();
            for chunk in chunks {
                match ledger.rerun(&chunk, from, dry_run).await {
                    Ok(plan) => done.push((chunk, plan)),
                    Err(e) => {
                        failed += 1;
                        eprintln!("chunk {chunk}: {e}");
                    }
                }
            }
            durable(&ledger, dry_run).await?;
            for (chunk, plan) in done {
                println!("chunk {chunk} {verb} again: {}", plan_text(&plan));
            }
            if failed > 0 {
                return Ok(exit::FATAL);
            }
        }
        Cmd::Verify { requeue } => {
            let cfg = Config::load(config()?)?;
            let ledger = existing_ledger(&url).await?;
            return verify(&cfg, &ledger, requeue).await;
        }
        Cmd::Vacuum { retain, allow_short_retention, dry_run } => {
            let cfg = Config::load(config()?)?;
            let ledger = existing_ledger(&url).await?;
            return vacuum(&cfg, &ledger, retain, allow_short_retention, dry_run).await;
        }
        Cmd::Compact { target_size, dry_run } => {
            let cfg = Config::load(config()?)?;
            let ledger = existing_ledger(&url).await?;
            return compact(&cfg, &ledger, target_size, dry_run).await;
        }
        Cmd::Prune { older_than, dry_run } => {
            let ledger = existing_ledger(&url).await?;
            let cutoff = chrono::Utc::now().timestamp_millis() - std::time::Duration::from(older_than).as_millis() as i64;
            let p = ledger.prune(cutoff, dry_run).await?;
            let verb = if dry_run { "would delete" } else { "deleted" };
            println!(
                "pipeline {}: {verb} {} attempt(s), {} task(s), {} outage(s), {} note(s) older than {older_than}",
                ledger.pipeline(),
                p.attempts,
                p.tasks,
                p.outages,
                p.notes
            );
        }
        Cmd::Skip { chunk, reason, dry_run } => {
            let cfg = Config::load(config()?)?;
            let ledger = existing_ledger(&url).await?;
            // A load whose parts are in the table already, moved by an attempt that died (or
            // could not take them back) before recording them: only the store knows. Closing
            // it would leave them there with no row naming them. What the ledger can tell (a
            // sibling's switch, its own rows) `Ledger::skip` checks in its transaction.
            let table = ferry_load::open_table(&cfg, &ledger).map_err(ferry_admin::from_table)?;
            let dest = table.store();
            let visible = table.unrecorded(&chunk).await.map_err(ferry_admin::from_table)?;
            if let Some(path) = visible.first() {
                return Err(ConfigError::new(
                    "--chunk",
                    format!(
                        "{} of chunk {chunk}'s parts are in the table already with no row naming them ({} among them): an \
                         attempt moved them and ended before recording them, so it is not skipped; let load run (or \
                         `ferry requeue --stage load`), and it records them",
                        visible.len(),
                        dest.url(path)
                    ),
                )
                .into());
            }
            let n = ledger.skip(&chunk, &reason, dry_run, cfg.source.versions == Versions::Replace).await?;
            durable(&ledger, dry_run).await?;
            let verb = if dry_run { "would skip" } else { "skipped" };
            println!("{verb} {n} unfinished task(s) of chunk {chunk}: {reason}");
        }
    }
    Ok(exit::OK)
}

/// The stages a rerun runs again, in order: "transform -> copy -> load".
fn plan_text(plan: &[Stage]) -> String {
    plan.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" -> ")
}

/// An operator's decision (a skip, a requeue, a rerun) is on disk before the command says it is
/// done: on a ledger that acknowledges commits before they are flushed (Postgres with
/// `synchronous_commit = off`, SQLite's `NORMAL`), a power cut could otherwise undo a skip the
/// operator was told of, and the chunk would load after all.
async fn durable(ledger: &Ledger, dry_run: bool) -> Result<(), Error> {
    if !dry_run {
        ledger.make_durable().await?;
    }
    Ok(())
}

/// `ferry verify`: the table on the destination against what the ledger says is published.
async fn verify(cfg: &Config, ledger: &Ledger, requeue: bool) -> Result<i32, Error> {
    let table = ferry_load::open_table(cfg, ledger).map_err(ferry_admin::from_table)?;
    let found = table.verify().await.map_err(ferry_admin::from_table)?;
    for line in &found.lines {
        println!("{line}");
    }
    if requeue {
        for chunk in &found.bad_chunks {
            match ledger.rerun(chunk, ferry_ledger::Stage::Transform, false).await {
                Ok(plan) => {
                    println!("chunk {chunk} will run again: {}", plan_text(&plan))
                }
                Err(e) => println!("chunk {chunk} could not be requeued: {e}"),
            }
        }
    }
    Ok(if found.problems > 0 { exit::QUARANTINED } else { exit::OK })
}

/// `ferry vacuum`: files no reader of the table needs, past the retention (Delta).
async fn vacuum(
    cfg: &Config,
    ledger: &Ledger,
    retain: Option<std::time::Duration>,
    allow_short: bool,
    dry_run: bool,
) -> Result<i32, Error> {
    let table = ferry_load::open_table(cfg, ledger).map_err(ferry_admin::from_table)?;
    let v = table.vacuum(retain, allow_short, dry_run).await.map_err(ferry_admin::from_table)?;
    let verb = if dry_run { "would delete" } else { "deleted" };
    for f in &v.deleted {
        println!("{verb} {f}");
    }
    println!(
        "{} table {} at version {}: {verb} {} removed file(s) and {} file(s) no version names, {} bytes; {} removed \
         file(s) within the retention kept, {} kept for chunks at work again",
        format_name(table.format()),
        cfg.table.name,
        v.version,
        v.files - v.untracked,
        v.untracked,
        v.bytes,
        v.kept,
        v.again
    );
    Ok(exit::OK)
}

/// `ferry compact`: the table's small files merged (Delta).
async fn compact(cfg: &Config, ledger: &Ledger, target: u64, dry_run: bool) -> Result<i32, Error> {
    if target < 2 {
        return Err(ConfigError::new("--target-size", "must be at least 2 bytes").into());
    }
    let table = ferry_load::open_table(cfg, ledger).map_err(ferry_admin::from_table)?;
    let c = table.compact(target.min(i64::MAX as u64) as i64, dry_run).await.map_err(ferry_admin::from_table)?;
    for l in &c.lines {
        println!("{l}");
    }
    let verb = if dry_run { "would merge" } else { "merged" };
    println!(
        "{} table {} at version {}: {verb} {} file(s), {} bytes, in {} merge(s); {} merge(s) lost to another commit",
        format_name(table.format()),
        cfg.table.name,
        c.version,
        c.files_in,
        c.bytes_in,
        c.merges,
        c.lost
    );
    Ok(exit::OK)
}

/// A table format's name as the summaries print it: "Delta", "Hive".
fn format_name(format: &str) -> String {
    match format {
        "delta" => "Delta".to_string(),
        other => other[..1].to_uppercase() + &other[1..],
    }
}

/// `--target-size 128MiB`.
fn parse_size(s: &str) -> Result<u64, String> {
    ferry_common::config::ByteSize::parse(s).map(|b| b.0)
}

/// `--sweep NAME`: one of [`Sweep::ALL`] by its name.
fn parse_sweep(name: &str) -> Result<Sweep, String> {
    Sweep::parse(name).ok_or_else(|| format!("no sweep {name:?}; one of: {}", Sweep::ALL.map(|s| s.name()).join(", ")))
}

/// `ferry gc`: what crashed writers left behind, and what finished work no longer needs:
/// every sweep, or the ones named.
async fn gc(cfg: &Config, url: &str, older_than: Option<std::time::Duration>, only: &[Sweep]) -> Result<i32, Error> {
    let cutoff = match older_than {
        Some(d) => chrono::Utc::now().timestamp_millis() - d.as_millis() as i64,
        // A live writer is at most a copy deadline into its file, plus two leases.
        None => cfg.temp_cutoff_ms(chrono::Utc::now().timestamp_millis()),
    };
    let staging = Store::open(&cfg.staging.url, &cfg.staging.store)?;
    let spool = Store::from_url(&cfg.spool.dir.to_string_lossy())?;
    let ledger = existing_ledger(url).await?.with_pipeline(&cfg.pipeline);
    let table = ferry_load::open_table(cfg, &ledger).map_err(ferry_admin::from_table)?;
    let meta_dirs = table.meta_dirs();
    let at = Places {
        cfg,
        ledger: &ledger,
        staging: Some(&staging),
        destination: Some(table.store()),
        spool: Some(&spool),
        meta_dirs: &meta_dirs,
    };
    // Each place on its own: one store that is down does not stop the others' cleanup.
    let (mut n, mut failed) = (0, 0);
    for sweep in Sweep::ALL.into_iter().filter(|s| only.is_empty() || only.contains(s)) {
        match sweep.run(&at, cutoff).await {
            Ok(k) => n += k,
            // A place that failed part-way still counts what it removed.
            Err(e) => {
                n += e.removed();
                failed += 1;
                eprintln!("gc of {} ({}) failed: {e}", sweep.what(), sweep.name());
            }
        }
    }
    println!("removed {n} abandoned file(s) or upload(s)");
    Ok(if failed > 0 { exit::FATAL } else { exit::OK })
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
    // Never migrates: reading or fixing the ledger must not change its schema under the
    // binaries of other hosts (`ferry migrate` does that).
    Ok(Ledger::connect(url, LedgerOptions { migrate: false, ..LedgerOptions::default() }).await?)
}

/// `ferry status`: the table, JSON, or a Nagios line; `--watch` repeats the first two.
async fn status_command(
    ledger: &Ledger,
    url: &str,
    json: bool,
    watch: Option<std::time::Duration>,
    check: Option<std::time::Duration>,
    label: &str,
) -> Result<i32, Error> {
    use std::io::IsTerminal;
    loop {
        let o = ledger.overview(ferry_runtime::observe::RATE_WINDOW).await?;
        if let Some(max_age) = check {
            let (code, line) = status::verdict(&o, max_age);
            println!("{line}");
            return Ok(code);
        }
        let parts = ledger.table_partitions().await?;
        let shown = if json {
            serde_json::to_string_pretty(&status::to_json(&o, url, &parts)).unwrap_or_default()
        } else {
            status::text(&o, url, &parts, label)
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
    (payload, gap_ms): (Payload, u64),
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
        let events = ferry_admin::sample::events_spread(file_seed, records, start_ms + i as i64 * 3_600_000, payload, gap_ms);
        ferry_admin::sample::write_events(&mut w, fmt, events, codec, block_records)
            .and_then(|_| std::io::Write::flush(&mut w))
            .map_err(|e| Error::io(tmp.display(), e))?;
        // Whole files only: a reader polling `out` never sees a half-written one.
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(path.display(), e))?;
        println!("{}", path.display());
    }
    Ok(())
}
