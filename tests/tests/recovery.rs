//! An operator fixes what does not heal by itself with `ferry` commands, not SQL: a source
//! file requeued after its format is fixed in the config, a chunk run again from a stage
//! after a published file was deleted by hand, a chunk skipped for good with its reason, and
//! a source file corrected in place, whose new rows replace the old ones under every
//! disposition, even when the rewrite keeps its size and mtime.

use std::path::Path;
use std::process::{Command, Output};

use ferry_tests::{Pipeline, STAGES, bin, files_under, input_digest};

fn ferry(p: &Pipeline, args: &[&str]) -> Output {
    Command::new(bin("ferry")).arg("--config").arg(&p.config).env_remove("FERRY_LEDGER").args(args).output().unwrap()
}

fn ok(o: &Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn run_all(p: &Pipeline) {
    for s in STAGES {
        let out = p.stage(s);
        assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn same_rows(p: &Pipeline, expect: &Path) {
    let want = input_digest("jsonl", expect);
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: the table holds exactly the expected records");
    }
}

fn with_source_setting(p: &Pipeline, line: &str) {
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replacen("[source]\n", &format!("[source]\n{line}\n"), 1)).unwrap();
}

#[test]
fn requeue_a_source_file_after_fixing_its_format() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("gen", "jsonl", "null", 1, 500, 3);
    let src = std::fs::read_dir(p.path("gen")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&src, p.path("in/export.data")).unwrap();
    std::fs::create_dir_all(p.path("expect")).unwrap();
    std::fs::copy(&src, p.path("expect/export.jsonl")).unwrap();
    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(3), "the unknown format is quarantined: {}", String::from_utf8_lossy(&out.stderr));

    with_source_setting(&p, "format = \"jsonl\"");
    let dry = ok(&ferry(&p, &["requeue", "--file", "export.data", "--dry-run"]), "dry run");
    assert!(dry.contains("would requeue 1 source file(s)"), "{dry}");
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 1, "a dry run changes nothing");
    ok(&ferry(&p, &["requeue", "--file", "export.data"]), "requeue");
    run_all(&p);
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 0);
    same_rows(&p, &p.path("expect"));
    let none = ferry(&p, &["requeue", "--file", "nothing-here.jsonl"]);
    assert_eq!(none.status.code(), Some(2), "naming a file the ledger does not have is an error");
}

#[test]
fn rerun_a_chunk_whose_published_file_was_deleted_and_skip_one_for_good() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 2, 600, 5);
    run_all(&p);
    same_rows(&p, &p.path("in"));
    // An operator deletes a published file by hand; the chunk is run again from transform.
    let (path, chunk) = {
        let path = p.sql("SELECT path FROM published ORDER BY path LIMIT 1");
        let chunk = p.sql(&format!("SELECT chunk_id FROM published WHERE path = '{path}'"));
        (path, chunk)
    };
    std::fs::remove_file(p.path(&format!("wh/{path}"))).unwrap();
    assert_ne!(p.table_digest()["rows"], 1200);
    let dry = ok(&ferry(&p, &["rerun", "--chunk", &chunk, "--from", "transform", "--dry-run"]), "dry run");
    assert!(dry.contains("would run again: transform -> copy -> load"), "{dry}");
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{chunk}' AND state = 'done'")), 3);
    ok(&ferry(&p, &["rerun", "--chunk", &chunk, "--from", "transform"]), "rerun");
    run_all(&p);
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
    same_rows(&p, &p.path("in"));
    // Run from load again with everything in place: nothing changes, nothing doubles.
    ok(&ferry(&p, &["rerun", "--chunk", &chunk, "--from", "load"]), "rerun from load");
    let out = p.stage("ferry-load");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    same_rows(&p, &p.path("in"));

    // A new file whose first chunk the operator gives up on.
    p.generate("more", "jsonl", "null", 1, 300, 6);
    let f = std::fs::read_dir(p.path("more")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&f, p.path("in/more.jsonl")).unwrap();
    ok(&p.stage("ferry-extract"), "extract");
    let first = p.sql("SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%more.jsonl' AND c.seq = 0");
    let skipped_records = p.count(&format!("SELECT records FROM chunks WHERE id = '{first}'"));
    ok(&ferry(&p, &["skip", "--chunk", &first, "--reason", "known bad export, re-sent as another file"]), "skip");
    run_all(&p);
    assert_eq!(p.sql(&format!("SELECT reason FROM skips WHERE chunk_id = '{first}'")), "known bad export, re-sent as another file");
    assert_eq!(p.count("SELECT COUNT(*) FROM tasks WHERE state <> 'done'"), 0);
    assert_eq!(p.table_digest()["rows"], 1200 + 300 - skipped_records);
    let status = ok(&ferry(&p, &["status"]), "status");
    assert!(status.contains(&format!("skipped chunk {first} at transform: known bad export")), "{status}");
}

/// A rerun from transform that produces other bytes (here: another codec) while the chunk's
/// load is still done from before. What its copy lands is not a stray for the cleanup however
/// old it is, and a published file is replaced only once its replacement is there: a landed
/// part that went missing leaves the published one in place, never a hole in the table.
#[test]
fn a_rerun_never_deletes_a_published_file_before_its_replacement_is_in_place() {
    let p = Pipeline::new("16KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 400, 11);
    run_all(&p);
    same_rows(&p, &p.path("in"));
    let chunk = p.sql("SELECT chunk_id FROM published ORDER BY path LIMIT 1");
    let published: Vec<String> =
        p.sql(&format!("SELECT group_concat(path, ' ') FROM published WHERE chunk_id = '{chunk}'")).split(' ').map(String::from).collect();
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replacen("[transform]\n", "[transform]\ncompression = \"snappy\"\n", 1)).unwrap();
    ok(&ferry(&p, &["rerun", "--chunk", &chunk, "--from", "transform"]), "rerun");
    ok(&p.stage("ferry-transform"), "transform");

    // A copy under way has landed the new parts (an hour ago, a slow link) and not committed
    // yet: the chunk's load task is still done from its first publish.
    let spool = p.path(&format!("spool/events/{chunk}"));
    let landed = p.path(&format!("wh/_ferry/landed/events/{chunk}"));
    std::fs::create_dir_all(&landed).unwrap();
    let status = Command::new("cp").arg("-r").arg(spool.join(".")).arg(&landed).status().unwrap();
    assert!(status.success());
    let status = Command::new("find").arg(&landed).args(["-exec", "touch", "-d", "2 hours ago", "{}", ";"]).status().unwrap();
    assert!(status.success());
    let landed_parts = || files_under(&landed).len();
    let n = landed_parts();
    assert_eq!(n as i64, p.count(&format!("SELECT COUNT(*) FROM parts WHERE chunk_id = '{chunk}'")), "landed where copy lands");
    ok(&ferry(&p, &["gc"]), "gc");
    assert_eq!(landed_parts(), n, "gc left the landed parts of a chunk being rerun");
    ok(&p.stage("ferry-load"), "load, nothing due: its start-up cleanup ran");
    assert_eq!(landed_parts(), n, "load's start-up cleanup left them too");

    // The copy commits; then one landed part goes missing before load (a hand, a bug).
    ok(&p.stage("ferry-copy"), "copy");
    let victim = files_under(&landed).into_iter().next().unwrap();
    let rel = victim.strip_prefix(&landed).unwrap().display().to_string();
    std::fs::remove_file(&victim).unwrap();
    let out = p.stage("ferry-load");
    assert_eq!(out.status.code(), Some(3), "the chunk waits in quarantine: {}", String::from_utf8_lossy(&out.stderr));
    for path in &published {
        assert!(p.path(&format!("wh/{path}")).is_file(), "{path}: the published file is still there");
    }
    same_rows(&p, &p.path("in"));
    assert!(rel.ends_with(".parquet"));
}

/// v1 published, then the file at the same path is corrected; after the next run the table
/// has v2's records and none of v1's.
fn corrected_in_place(disposition: &str, same_size_and_mtime: bool) {
    let p = Pipeline::new("16KiB", "30s", "0s");
    if disposition == "archive" {
        let archive = p.path("archive");
        with_source_setting(&p, &format!("disposition = \"archive\"\narchive_url = \"{}\"", archive.display()));
    } else {
        with_source_setting(&p, &format!("disposition = \"{disposition}\""));
    }
    p.generate("v1", "jsonl", "null", 1, 400, 7);
    let v1 = std::fs::read_dir(p.path("v1")).unwrap().next().unwrap().unwrap().path();
    p.generate("stay", "jsonl", "null", 1, 200, 9);
    let stay = std::fs::read_dir(p.path("stay")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&stay, p.path("in/stay.jsonl")).unwrap();
    std::fs::copy(&v1, p.path("in/data.jsonl")).unwrap();
    run_all(&p);
    assert_eq!(p.table_digest()["rows"], 600);

    let v2 = p.path("v2.jsonl");
    if same_size_and_mtime {
        // The same length, other bytes (a corrected host name), and the old mtime put back.
        let text = std::fs::read_to_string(&v1).unwrap().replacen("\"host\":\"", "\"host\":\"X", 50);
        let trimmed = trim_to(&text, std::fs::metadata(&v1).unwrap().len() as usize);
        std::fs::write(&v2, trimmed).unwrap();
        assert_eq!(std::fs::metadata(&v2).unwrap().len(), std::fs::metadata(&v1).unwrap().len());
    } else {
        p.generate("v2gen", "jsonl", "null", 1, 350, 8);
        let g = std::fs::read_dir(p.path("v2gen")).unwrap().next().unwrap().unwrap().path();
        std::fs::copy(g, &v2).unwrap();
    }
    let target = p.path("in/data.jsonl");
    let mtime = std::fs::metadata(&target).ok().map(|m| m.modified().unwrap());
    std::fs::write(&target, std::fs::read(&v2).unwrap()).unwrap();
    if same_size_and_mtime && let Some(t) = mtime {
        std::fs::File::options().write(true).open(&target).unwrap().set_modified(t).unwrap();
    }
    run_all(&p);
    run_all(&p);
    std::fs::create_dir_all(p.path("expect")).unwrap();
    std::fs::copy(&stay, p.path("expect/stay.jsonl")).unwrap();
    std::fs::copy(&v2, p.path("expect/data.jsonl")).unwrap();
    same_rows(&p, &p.path("expect"));
    assert_eq!(p.count("SELECT MAX(version) FROM source_files WHERE uri LIKE '%data.jsonl'"), 2);
}

/// `text` with its last lines' payloads shortened so that it is exactly `len` bytes (the
/// corrections above only add bytes).
fn trim_to(text: &str, len: usize) -> String {
    let mut extra = text.len() - len;
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for l in lines.iter_mut().rev() {
        if extra == 0 {
            break;
        }
        let key = "\"payload\":\"";
        let Some(start) = l.find(key).map(|i| i + key.len()) else { continue };
        let end = start + l[start..].find('"').unwrap();
        let cut = extra.min(end - start);
        l.replace_range(start..start + cut, "");
        extra -= cut;
    }
    lines.join("\n") + "\n"
}

#[test]
fn a_corrected_file_replaces_its_rows_with_keep() {
    corrected_in_place("keep", false);
}

#[test]
fn a_corrected_file_replaces_its_rows_with_delete() {
    corrected_in_place("delete", false);
}

#[test]
fn a_corrected_file_replaces_its_rows_with_archive() {
    corrected_in_place("archive", false);
}

#[test]
fn a_rewrite_with_the_same_size_and_mtime_is_hashed_not_skipped() {
    corrected_in_place("keep", true);
    corrected_in_place("delete", true);
}

/// A zombie copy that lands a chunk again after load published it leaves a landed file that
/// nothing will load: `ferry gc` removes it (and only it).
#[test]
fn gc_removes_a_landed_copy_of_a_published_chunk() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 300, 11);
    run_all(&p);
    let path = p.sql("SELECT path FROM published ORDER BY path LIMIT 1");
    let chunk = p.sql(&format!("SELECT chunk_id FROM published WHERE path = '{path}'"));
    let part_rel = path.strip_prefix("events/").unwrap().to_string();
    let stray = p.path(&format!("wh/_ferry/landed/events/{chunk}/{part_rel}"));
    std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
    std::fs::copy(p.path(&format!("wh/{path}")), &stray).unwrap();
    // A landed file of a chunk not published yet stays.
    let pending = p.path("wh/_ferry/landed/events/not-a-published-chunk/dt=2026-11-28/part-x.parquet");
    std::fs::create_dir_all(pending.parent().unwrap()).unwrap();
    std::fs::write(&pending, b"x").unwrap();
    ferry_tests::age(&stray, 60);
    ferry_tests::age(&pending, 60);
    // Sweeps run by name: another one leaves it, an unknown name is refused with the names.
    let out = ok(&ferry(&p, &["gc", "--older-than", "1s", "--sweep", "spent-spool", "--sweep", "staging-temps"]), "gc");
    assert!(stray.exists(), "only the named sweeps ran: {out}");
    let out = ferry(&p, &["gc", "--sweep", "everything"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("stray-landed"), "an unknown sweep is refused, naming the sweeps: {said}");
    let out = ok(&ferry(&p, &["gc", "--older-than", "1s", "--sweep", "stray-landed"]), "gc");
    assert!(!stray.exists(), "the zombie's landed copy is gone: {out}");
    assert!(pending.exists(), "a landed file waiting for load stays");
    assert!(p.path(&format!("wh/{path}")).exists(), "the published file stays");
    same_rows(&p, &p.path("in"));
}

/// A transform whose lease was lost mid-write (another worker, maybe on another host, did the
/// chunk) leaves its Parquet on its own spool, where no copy will ever take it: once the chunk
/// is copied, `ferry gc` removes it. A spool directory the ledger does not call copied stays.
#[test]
fn gc_removes_a_zombie_transforms_spool_files_once_the_chunk_is_copied() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 300, 13);
    run_all(&p);
    let path = p.sql("SELECT path FROM published ORDER BY path LIMIT 1");
    let chunk = p.sql(&format!("SELECT chunk_id FROM published WHERE path = '{path}'"));
    let part_rel = path.strip_prefix("events/").unwrap().to_string();
    let zombie = p.path(&format!("spool/events/{chunk}/{part_rel}"));
    assert!(!zombie.exists(), "copy removed its own spool files");
    std::fs::create_dir_all(zombie.parent().unwrap()).unwrap();
    std::fs::copy(p.path(&format!("wh/{path}")), &zombie).unwrap();
    let waiting = p.path("spool/events/a-chunk-not-copied-yet/dt=2026-11-28/part-x.parquet");
    std::fs::create_dir_all(waiting.parent().unwrap()).unwrap();
    std::fs::write(&waiting, b"x").unwrap();
    // Younger than --older-than: a writer may be at work.
    let out = ok(&ferry(&p, &["gc", "--older-than", "1h"]), "gc");
    assert!(zombie.exists(), "a spool file written within --older-than stays: {out}");
    ferry_tests::age(&p.path("spool/events"), 60);
    let out = ok(&ferry(&p, &["gc", "--older-than", "1s"]), "gc");
    assert!(!p.path(&format!("spool/events/{chunk}")).exists(), "the zombie's spool files are gone: {out}");
    assert!(waiting.exists(), "spool files of a chunk not copied yet stay");
    same_rows(&p, &p.path("in"));
}

/// What a Spark or Hadoop job leaves next to its output is not input.
#[test]
fn job_markers_and_hidden_files_are_not_ingested() {
    let p = Pipeline::new("64KiB", "30s", "0s");
    p.generate("in", "jsonl", "null", 1, 100, 12);
    std::fs::write(p.path("in/_SUCCESS"), b"").unwrap();
    std::fs::write(p.path("in/.events.jsonl.crc"), b"crc").unwrap();
    std::fs::create_dir_all(p.path("in/_temporary/0")).unwrap();
    std::fs::write(p.path("in/_temporary/0/part-0.jsonl"), b"{\"half\": ").unwrap();
    let out = p.stage("ferry-extract");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files"), 1, "only the data file");
}

/// Load publishes a chunk whole or not at all: a conflict on its second partition leaves
/// none of its rows visible; after the operator clears it, the chunk goes in whole.
#[test]
fn a_conflict_on_one_partition_publishes_none_of_the_chunk() {
    let p = Pipeline::new("1MiB", "30s", "0s");
    // One file, one chunk, events over two days: two partitions.
    let mut lines = String::new();
    for i in 0..400 {
        let day = 28 + i % 2;
        lines += &format!(
            "{{\"event_id\":\"e{i:04}\",\"ts\":\"2026-11-{day}T10:00:{:02}Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"p\",\"score\":null}}\n",
            i % 60
        );
    }
    std::fs::write(p.path("in/two-days.jsonl"), lines).unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        ok(&p.stage(s), s);
    }
    assert_eq!(p.count("SELECT COUNT(*) FROM chunks"), 1);
    let chunk = p.sql("SELECT id FROM chunks");
    let parts = p.count("SELECT COUNT(*) FROM parts");
    assert!(parts >= 2, "{parts} partitions");
    let last = p.sql("SELECT partition || '/' || name FROM parts ORDER BY partition DESC LIMIT 1");
    let squatter = p.path(&format!("wh/events/{last}"));
    std::fs::create_dir_all(squatter.parent().unwrap()).unwrap();
    std::fs::write(&squatter, b"someone else's file").unwrap();
    let out = p.stage("ferry-load");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let mut visible = Vec::new();
    for e in std::fs::read_dir(p.path("wh/events")).unwrap().flatten().filter(|e| e.file_name() != "_ferry") {
        for f in std::fs::read_dir(e.path()).unwrap().flatten() {
            if f.path() != squatter && f.file_name().to_string_lossy().contains(&chunk) {
                visible.push(f.path());
            }
        }
    }
    assert!(visible.is_empty(), "none of the chunk is visible: {visible:?}");
    std::fs::remove_file(&squatter).unwrap();
    ok(&ferry(&p, &["requeue", "--chunk", &chunk]), "requeue");
    ok(&p.stage("ferry-load"), "load");
    same_rows(&p, &p.path("in"));
}

/// Not only a conflict: any failure after some of a chunk's parts moved (here the last
/// partition's directory refuses new entries, `chattr +i`, which holds for root too) leaves
/// none of the chunk visible; once the directory takes files again the chunk goes in whole.
#[test]
fn a_failed_move_of_the_last_part_publishes_none_of_the_chunk() {
    struct Immutable(std::path::PathBuf);
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let p = Pipeline::new("1MiB", "30s", "0s");
    let mut lines = String::new();
    for i in 0..300 {
        let day = 26 + i % 3;
        lines += &format!(
            "{{\"event_id\":\"f{i:04}\",\"ts\":\"2026-11-{day}T11:00:{:02}Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{i},\"payload\":\"p\",\"score\":null}}\n",
            i % 60
        );
    }
    std::fs::write(p.path("in/three-days.jsonl"), lines).unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        ok(&p.stage(s), s);
    }
    let chunk = p.sql("SELECT id FROM chunks");
    assert_eq!(p.count("SELECT COUNT(*) FROM parts"), 3);
    let last = p.sql("SELECT partition FROM parts ORDER BY partition DESC LIMIT 1");
    let dir = p.path(&format!("wh/events/{last}"));
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("chattr").arg("+i").arg(&dir).status().unwrap();
    assert!(st.success(), "chattr +i {}", dir.display());
    let guard = Immutable(dir.clone());
    let out = p.stage("ferry-load");
    assert_ne!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let visible: Vec<_> = files_under(&p.path("wh/events"))
        .into_iter()
        .filter(|f| !f.starts_with(p.path("wh/events/_ferry")) && f.to_string_lossy().contains(&chunk))
        .collect();
    assert!(visible.is_empty(), "none of the chunk is visible after its third move failed: {visible:?}");
    drop(guard);
    let _ = ferry(&p, &["requeue", "--chunk", &chunk]);
    let _ = ferry(&p, &["rerun", "--chunk", &chunk, "--from", "load"]);
    ok(&p.stage("ferry-load"), "load");
    same_rows(&p, &p.path("in"));
}
