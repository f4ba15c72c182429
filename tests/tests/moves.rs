//! A chunk goes into its table all or nothing on every store: when the move of one of its parts
//! fails after others went in (here the k-th partition's directory refuses new entries, on
//! each store in its own way), none of the chunk is visible; once the directory takes files
//! again the chunk goes in whole, exactly once.
//!
//! - local: `chattr +i` on the partition directory (holds for root too);
//! - HDFS: a namespace quota of 1 on it (`hdfs dfsadmin -setQuota`): the NameNode refuses the
//!   rename with `NSQuotaExceededException`;
//! - S3: `chattr +i` on the directory that holds the partition's objects in the test server's
//!   posix backend: the server answers the copy with an error of its own.

use std::path::PathBuf;
use std::process::{Command, Output};

use ferry_tests::clusters::{MiniDfs, S3Server};
use ferry_tests::{Pipeline, bin, files_under, input_digest, s3_table_digest, table_digest};

fn ferry(p: &Pipeline, args: &[&str]) -> Output {
    Command::new(bin("ferry")).arg("--config").arg(&p.config).env_remove("FERRY_LEDGER").args(args).output().unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

/// One source file of 300 records over three days: one chunk, three parts.
fn three_days(p: &Pipeline) {
    let mut lines = String::new();
    for i in 0..300 {
        let day = 26 + i % 3;
        lines += &format!(
            "{{\"event_id\":\"m{i:04}\",\"ts\":\"2026-11-{day}T11:00:{:02}Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"p\",\"score\":null}}\n",
            i % 60
        );
    }
    std::fs::write(p.path("in/three-days.jsonl"), lines).unwrap();
}

/// How a store is made to refuse one partition, and to take it again.
trait Refuse {
    fn refuse(&self, partition: &str);
    fn allow(&self, partition: &str);
    /// The table's files (paths or names) as the store lists them.
    fn table_files(&self) -> Vec<String>;
}

/// Runs a chunk of three parts to the point of load, makes the `k`-th partition (1-based, in
/// the order load moves them) refuse new files, loads, and checks that none of the chunk is
/// visible; then lets it take files again and checks the table holds the input exactly once.
fn fail_kth_move(p: &Pipeline, store: &dyn Refuse, k: usize) {
    three_days(p);
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        ok(&p.stage(s), s);
    }
    let chunk = p.sql("SELECT id FROM chunks");
    assert_eq!(p.count("SELECT COUNT(*) FROM parts"), 3);
    let partition = p.sql(&format!("SELECT partition FROM parts ORDER BY partition LIMIT 1 OFFSET {}", k - 1));
    store.refuse(&partition);
    let out = p.stage("ferry-load");
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert_ne!(out.status.code(), Some(0), "load must fail while {partition} refuses files: {log}");
    let visible: Vec<String> = store.table_files().into_iter().filter(|f| f.contains(&chunk)).collect();
    assert!(visible.is_empty(), "none of the chunk is visible after its move into {partition} failed: {visible:?}\n{log}");
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 0, "nothing is recorded published");
    store.allow(&partition);
    let _ = ferry(p, &["requeue", "--chunk", &chunk]);
    ok(&p.stage("ferry-load"), "load once the partition takes files again");
    assert_eq!(p.count("SELECT COUNT(*) FROM published"), 3);
    let visible = store.table_files().into_iter().filter(|f| f.contains(&chunk)).count();
    assert_eq!(visible, 3, "the chunk's three parts are in the table once each");
}

/// `chattr -i` on drop, so that a failed test leaves a directory its temp dir can remove.
struct Immutable(Vec<PathBuf>);

impl Immutable {
    fn set(&mut self, dir: PathBuf) {
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("chattr").arg("+i").arg(&dir).status().unwrap();
        assert!(st.success(), "chattr +i {}", dir.display());
        self.0.push(dir);
    }
    fn unset(&mut self, dir: &PathBuf) {
        let st = Command::new("chattr").arg("-i").arg(dir).status().unwrap();
        assert!(st.success(), "chattr -i {}", dir.display());
        self.0.retain(|d| d != dir);
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = Command::new("chattr").arg("-i").arg(d).status();
        }
    }
}

struct Local<'a> {
    p: &'a Pipeline,
    guard: std::cell::RefCell<Immutable>,
}

impl Refuse for Local<'_> {
    fn refuse(&self, partition: &str) {
        self.guard.borrow_mut().set(self.p.path(&format!("wh/events/{partition}")));
    }
    fn allow(&self, partition: &str) {
        self.guard.borrow_mut().unset(&self.p.path(&format!("wh/events/{partition}")));
    }
    fn table_files(&self) -> Vec<String> {
        let meta = self.p.path("wh/events/_ferry");
        files_under(&self.p.path("wh/events")).into_iter().filter(|f| !f.starts_with(&meta)).map(|f| f.display().to_string()).collect()
    }
}

#[test]
fn local_a_failed_second_move_publishes_none_of_the_chunk() {
    let p = Pipeline::new("1MiB", "30s", "0s");
    let store = Local { p: &p, guard: std::cell::RefCell::new(Immutable(Vec::new())) };
    fail_kth_move(&p, &store, 2);
    let got = p.table_digest();
    let want = input_digest("jsonl", &p.path("in"));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}

struct Hdfs<'a> {
    a: &'a MiniDfs,
    root: String,
}

impl Refuse for Hdfs<'_> {
    fn refuse(&self, partition: &str) {
        let dir = format!("{}/events/{partition}", self.root);
        self.a.fs(&["-mkdir", "-p", &dir]);
        // The directory itself counts as one name: nothing more goes in.
        self.a.admin(&["-setQuota", "1", &dir]);
    }
    fn allow(&self, partition: &str) {
        self.a.admin(&["-clrQuota", &format!("{}/events/{partition}", self.root)]);
    }
    fn table_files(&self) -> Vec<String> {
        let ls = String::from_utf8_lossy(&self.a.fs(&["-ls", "-R", &format!("{}/events", self.root)]).stdout).to_string();
        ls.lines()
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().last())
            .filter(|f| !f.contains("/_ferry/"))
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn hdfs_a_failed_second_move_publishes_none_of_the_chunk() {
    let a = MiniDfs::start("A");
    let dest = format!("[destination]\nurl = \"{}/wh\"\n[destination.store]\ncall_timeout = \"5s\"\n", a.url);
    let p = Pipeline::with_stores("1MiB", "30s", "0s", None, Some(dest));
    let store = Hdfs { a: &a, root: "/wh".into() };
    fail_kth_move(&p, &store, 2);
    let local = p.path("readback");
    a.fs(&["-get", "/wh/events", local.to_str().unwrap()]);
    let got = table_digest(&local);
    let want = input_digest("jsonl", &p.path("in"));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}

struct S3<'a> {
    s3: &'a S3Server,
    prefix: String,
    guard: std::cell::RefCell<Immutable>,
}

impl S3<'_> {
    /// The directory of the test server's posix backend that holds `rel` of this table.
    fn backend(&self, rel: &str) -> PathBuf {
        let data = std::env::var("FERRY_TEST_S3_DATA").expect("FERRY_TEST_S3_DATA: the S3 test server's data directory (scripts/s3.sh)");
        PathBuf::from(data).join(&self.s3.bucket).join(&self.prefix).join("events").join(rel)
    }
}

impl Refuse for S3<'_> {
    fn refuse(&self, partition: &str) {
        self.guard.borrow_mut().set(self.backend(partition));
    }
    fn allow(&self, partition: &str) {
        self.guard.borrow_mut().unset(&self.backend(partition));
    }
    fn table_files(&self) -> Vec<String> {
        let meta = self.backend("_ferry");
        files_under(&self.backend("")).into_iter().filter(|f| !f.starts_with(&meta)).map(|f| f.display().to_string()).collect()
    }
}

#[test]
fn s3_a_failed_second_move_publishes_none_of_the_chunk() {
    let s3 = S3Server::from_env();
    let prefix = format!("moves-{}", std::process::id());
    let dest = s3.destination_toml(&prefix, &s3.endpoint, 1, "3s");
    let p = Pipeline::with_stores("1MiB", "30s", "0s", None, Some(dest));
    let store = S3 { s3: &s3, prefix: prefix.clone(), guard: std::cell::RefCell::new(Immutable(Vec::new())) };
    fail_kth_move(&p, &store, 2);
    let got = s3_table_digest(&format!("{}/{prefix}/events", s3.bucket));
    let want = input_digest("jsonl", &p.path("in"));
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}");
    }
}
