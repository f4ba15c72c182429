//! `ferry`: the admin binary. Migrate and inspect the ledger, requeue quarantined work.

use clap::{Parser, Subcommand};
use ferry_common::cli::{self, CommonArgs, exit};
use ferry_common::ledger::{Ledger, LedgerOptions, RequeueFilter, Stage};

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
    let code = match run(cli).await {
        Ok(code) => code,
        Err(e) => cli::report(&e),
    };
    std::process::exit(code);
}

async fn run(cli: Cli) -> ferry_common::Result<i32> {
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
                println!("  {state:<12} {n:>8}");
            }
            println!("tasks:");
            println!("  {:<10} {:<12} {:>8} {:>14}", "stage", "state", "tasks", "bytes");
            for r in &st.backlog {
                println!("  {:<10} {:<12} {:>8} {:>14}", r.stage, r.state, r.tasks, r.bytes);
            }
            println!("stuck leases: {}", st.stuck_leases);
            println!("redone attempts: {} ({} bytes)", st.redone_attempts, st.redone_bytes);
            let quarantined: i64 = st.backlog.iter().filter(|r| r.state == "quarantined").map(|r| r.tasks).sum();
            if quarantined > 0 {
                println!("{quarantined} task(s) quarantined: see `SELECT * FROM recent_failures`, then `ferry requeue`");
            }
        }
        Cmd::Requeue { stage, chunk } => {
            let n = ledger.requeue(&RequeueFilter { stage, chunk_id: chunk }).await?;
            println!("requeued {n} task(s)");
        }
    }
    Ok(exit::OK)
}
