//! The docs against the ledger they describe: every `sql` block in the README and docs/ runs as
//! it is on a SQLite and on a Postgres ledger that a pipeline has written to, and docs/sql.md
//! describes every column of every table and view of both (and nothing that is not there).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use ferry_tests::clusters::repo_root;
use ferry_tests::{Pipeline, postgres::Postgres};

/// The Markdown files a reader is sent to.
fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs")).unwrap().map(|e| e.unwrap().path()).collect();
    docs.sort();
    files.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    files
}

/// Every ```sql block, with the file and line it starts at.
fn sql_blocks() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in doc_files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut block: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match &mut block {
                None if line.trim() == "```sql" => block = Some((i + 1, String::new())),
                Some((start, sql)) if line.trim() == "```" => {
                    out.push((format!("{}:{start}", f.strip_prefix(repo_root()).unwrap().display()), std::mem::take(sql)));
                    block = None;
                }
                Some((_, sql)) => {
                    sql.push_str(line);
                    sql.push('\n');
                }
                None => {}
            }
        }
        assert!(block.is_none(), "{}: a sql block is not closed", f.display());
    }
    out
}

/// The columns of every table and view, by name, as documented: each `### name` section of
/// docs/sql.md and the `` | `column` | `` rows of its table.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(repo_root().join("docs/sql.md")).unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("### ") {
            current = Some(name.trim().to_string());
            out.entry(name.trim().to_string()).or_default();
        } else if line.starts_with("## ") {
            current = None;
        } else if let (Some(t), Some(rest)) = (&current, line.strip_prefix("| `")) {
            let col = rest.split('`').next().unwrap();
            out.get_mut(t).unwrap().insert(col.to_string());
        }
    }
    out
}

/// A SQLite ledger's tables and views with their columns (Ferry's own, not sqlx's bookkeeping).
fn sqlite_columns(p: &Pipeline) -> BTreeMap<String, BTreeSet<String>> {
    let names = p.sql(
        "SELECT group_concat(name, ' ') FROM sqlite_master WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%'",
    );
    names
        .split_whitespace()
        .map(|t| {
            let cols = p.sql(&format!("SELECT group_concat(name, ' ') FROM pragma_table_info('{t}')"));
            (t.to_string(), cols.split_whitespace().map(str::to_string).collect())
        })
        .collect()
}

fn postgres_columns(pg: &Postgres) -> BTreeMap<String, BTreeSet<String>> {
    let rows = pg.sql(
        "SELECT table_name || ' ' || column_name FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name NOT LIKE '\\_sqlx%'",
    );
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in rows.lines() {
        let (t, c) = line.split_once(' ').unwrap();
        out.entry(t.to_string()).or_default().insert(c.to_string());
    }
    out
}

/// Source files for a pipeline that publishes a few files and rejects one record.
fn inputs(p: &Pipeline) {
    p.add_jsonl_batch("a", 2, 200, 1);
    let bad = "{\"event_id\":\"x\",\"ts\":\"2026-11-20T10:00:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":\"nan\",\"payload\":\"p\",\"score\":null}\n";
    std::fs::write(p.path("in/bad.jsonl"), bad).unwrap();
}

/// Three rounds of the four stages (enough for these inputs on any ledger).
fn rounds(p: &Pipeline) {
    for _ in 0..3 {
        for s in ferry_tests::STAGES {
            p.stage_round(s);
        }
    }
}

#[test]
fn every_sql_block_in_the_docs_runs_and_every_ledger_column_is_described() {
    let blocks = sql_blocks();
    assert!(blocks.len() >= 5, "the SQL reference's examples: {}", blocks.len());
    let docs = documented();

    let lite = Pipeline::new("16KiB", "30s", "0s");
    inputs(&lite);
    rounds(&lite);
    assert!(lite.count("SELECT COUNT(*) FROM published") > 0 && lite.count("SELECT COUNT(*) FROM rejects") == 1);
    for (at, sql) in &blocks {
        let out = Command::new("python3")
            .args(["-c", "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nfor s in sys.argv[2].split(';'):\n    s.strip() and c.execute(s).fetchall()"])
            .arg(lite.path("ledger.db"))
            .arg(sql)
            .output()
            .unwrap();
        assert!(out.status.success(), "{at} on SQLite: {}\n{sql}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(sqlite_columns(&lite), docs, "docs/sql.md against a SQLite ledger's tables, views and columns");

    let pg = Postgres::start(false);
    let on_pg = Pipeline::new("16KiB", "30s", "0s");
    on_pg.use_ledger(&pg.url());
    inputs(&on_pg);
    rounds(&on_pg);
    assert!(pg.count("SELECT COUNT(*) FROM published") > 0 && pg.count("SELECT COUNT(*) FROM rejects") == 1);
    for (at, sql) in &blocks {
        let out = Command::new(pg.psql())
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql.as_str()])
            .arg(format!("{}?sslmode=disable", pg.url()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{at} on Postgres: {}\n{sql}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(postgres_columns(&pg), docs, "docs/sql.md against a Postgres ledger's tables, views and columns");
}
