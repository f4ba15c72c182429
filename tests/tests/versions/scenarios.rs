//! `source.versions = "replace"`: for every source file the table shows exactly one whole
//! version, the newest that could be loaded whole; a version that cannot be loaded whole
//! leaves the one before in the table and says why. Each test goes through a path the common
//! case never takes: a correction that is itself corrupt, a correction with one bad chunk
//! (until an operator skips it), and a correction undone (the old bytes put back).

use std::process::Output;

use ferry_tests::{Pipeline, STAGES, files_under, input_digest};

/// A pipeline of 16 KiB chunks whose table has the layout this binary tests.
pub(crate) fn pipeline() -> Pipeline {
    Pipeline::new("16KiB", "30s", "0s").table_format(super::FORMAT)
}

pub(crate) fn run_all(p: &Pipeline) -> Vec<Output> {
    STAGES.iter().map(|s| p.stage_round(s)).collect()
}

/// `n` event lines whose ids start with `tag`; the lines in `bad` have a `user_id` that is not
/// a number (each is a rejected record).
pub(crate) fn events(tag: &str, n: usize, bad: std::ops::Range<usize>) -> String {
    (0..n)
        .map(|i| {
            let user = if bad.contains(&i) { "\"not-a-number\"".to_string() } else { i.to_string() };
            format!(
                "{{\"event_id\":\"{tag}-{i:05}\",\"ts\":\"2026-11-{:02}T10:{:02}:00Z\",\"host\":\"h\",\"kind\":\"k\",\"user_id\":{user},\"payload\":\"{}\",\"score\":null}}\n",
                20 + i % 3,
                i % 60,
                "p".repeat(60)
            )
        })
        .collect()
}

/// The table's rows are exactly these files' lines.
pub(crate) fn table_is(p: &Pipeline, files: &[(&str, &str)]) {
    let dir = p.path(&format!("expect-{}", rand_tag()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let want = input_digest("jsonl", &dir);
    let got = p.table_digest();
    for k in ["rows", "distinct", "digest"] {
        assert_eq!(got[k], want[k], "{k}: the table holds exactly the expected version");
    }
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Runs the stages until no task is left to do (a version's chunks that waited while another
/// of them switched it in are done on a later run); fails the test if five rounds leave any.
pub(crate) fn settle(p: &Pipeline) {
    for _ in 0..5 {
        run_all(p);
        if p.count("SELECT COUNT(*) FROM tasks WHERE state NOT IN ('done', 'quarantined')") == 0 {
            return;
        }
    }
    panic!(
        "five rounds left tasks to do: {}",
        p.sql("SELECT group_concat(stage || ' ' || state || ': ' || COALESCE(last_error, ''), '; ') FROM tasks WHERE state NOT IN ('done', 'quarantined')")
    );
}

/// Runs `ferry ARGS` on the pipeline's config and asserts it succeeded.
pub(crate) fn ferry_ok(p: &Pipeline, args: &[&str]) {
    let out = p.command("ferry").args(args).output().unwrap();
    assert!(out.status.success(), "ferry {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub(crate) fn stage_ok(p: &Pipeline, s: &str) {
    let out = p.stage(s);
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{s}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Version 1 is copied but not loaded yet when a corrupt version 2 arrives (quarantined by
/// extract): version 1 still goes in whole. So does one whose correction is the same bytes as
/// another file already taken in.
#[test]
fn a_correction_that_cannot_be_taken_in_leaves_the_version_before_whole() {
    for second in ["corrupt", "duplicate"] {
        let p = pipeline();
        let v1 = events("v1", 300, 0..0);
        let other = events("other", 50, 0..0);
        std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
        std::fs::write(p.path("in/other.jsonl"), &other).unwrap();
        for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
            stage_ok(&p, s);
        }
        let v2: Vec<u8> = if second == "corrupt" { b"\x1f\x8b\x08\x00gzip, not JSON lines".to_vec() } else { other.clone().into_bytes() };
        std::fs::write(p.path("in/data.jsonl"), v2).unwrap();
        for _ in 0..2 {
            run_all(&p);
        }
        assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 1, "{second}: version 2 set aside");
        table_is(&p, &[("data.jsonl", &v1), ("other.jsonl", &other)]);
    }
}

/// A correction with one chunk that cannot be loaded (too many bad records) is not published
/// in part: version 1 stays whole and the ledger says why, until the operator skips the bad
/// chunk; then version 2 without it goes in whole and version 1 goes out.
#[test]
fn a_correction_with_a_bad_chunk_waits_whole_until_the_operator_decides() {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    run_all(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    // Version 2: the same number of lines, new ids, and a run of bad records in its middle
    // (max_bad_records is 5 a chunk: the chunk holding most of them is quarantined).
    let v2 = events("v2", 300, 140..170);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    for _ in 0..3 {
        run_all(&p);
    }
    let bad = p.sql(
        "SELECT t.chunk_id FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id
         WHERE f.version = 2 AND t.state = 'quarantined' ORDER BY t.chunk_id LIMIT 1",
    );
    assert!(!bad.is_empty(), "a chunk of version 2 is quarantined");
    table_is(&p, &[("data.jsonl", &v1)]);
    let why = p.sql("SELECT last_error FROM tasks WHERE stage = 'load' AND state = 'retryable' LIMIT 1");
    assert!(why.contains("published only whole") && why.contains(&bad), "the ledger says why: {why}");

    let out = p.command("ferry").args(["skip", "--chunk", &bad, "--reason", "test: a bad chunk"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The waiting load tasks look again after a while; rerun from load makes them due now.
    for c in p.sql("SELECT group_concat(t.chunk_id, ' ') FROM tasks t WHERE t.stage = 'load' AND t.state = 'retryable'").split(' ') {
        if !c.is_empty() {
            let out = p.command("ferry").args(["rerun", "--chunk", c, "--from", "load"]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    // The skipped chunk goes through the stages with nothing in it and publishes the version;
    // the chunks that waited are woken and record their parts.
    let settled = |p: &Pipeline| p.count("SELECT COUNT(*) FROM tasks WHERE state NOT IN ('done', 'quarantined')") == 0;
    for _ in 0..20 {
        run_all(&p);
        if settled(&p) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(settled(&p), "{}", p.sql("SELECT group_concat(stage || ' ' || state || ' ' || COALESCE(last_error, ''), ' | ') FROM tasks WHERE state NOT IN ('done', 'quarantined')"));
    let rows = p.table_digest()["rows"].as_i64().unwrap();
    let expected = p.count(&format!(
        "SELECT (SELECT SUM(records) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.version = 2 AND c.id <> '{bad}')
              - (SELECT COUNT(*) FROM rejects r JOIN chunks c ON c.id = r.chunk_id JOIN source_files f ON f.id = c.file_id
                 WHERE f.version = 2 AND c.id <> '{bad}')"
    ));
    assert_eq!(rows, expected, "version 2 without the skipped chunk, whole; nothing of version 1");
    assert_eq!(p.count("SELECT COUNT(*) FROM published p JOIN chunks c ON c.id = p.chunk_id JOIN source_files f ON f.id = c.file_id WHERE f.version = 1"), 0);
}

/// Version 2 replaced version 1 in the table; then the old bytes are put back (the
/// correction undone): they are the file's newest version again, and the table shows them.
/// `data.jsonl` taken in, then corrected: the table shows the correction. Returns the pipeline
/// and the first version's text.
pub(crate) fn corrected_once() -> (Pipeline, String) {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    let v2 = events("v2", 250, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    run_all(&p);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    run_all(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    (p, v1)
}

#[test]
fn a_correction_undone_puts_the_old_version_back_whole() {
    let (p, v1) = corrected_once();
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    for _ in 0..2 {
        run_all(&p);
    }
    table_is(&p, &[("data.jsonl", &v1)]);
    assert_eq!(
        p.count("SELECT version FROM source_files WHERE content_hash = (SELECT content_hash FROM source_files ORDER BY id LIMIT 1)"),
        3
    );
}

/// The same, when extract dies between registering the old bytes (which stores their new
/// change token on the old version's row) and making them the newest version again: the next
/// run must not take the token as "seen, unchanged" and skip the file for ever. The crash is
/// reproduced by leaving the ledger as that instant does: the old row with the file's token.
#[test]
fn a_correction_undone_is_revived_after_a_crash_between_registration_and_revival() {
    let (p, v1) = corrected_once();
    // New bytes in place by rename (a new inode), as a sender puts a file back.
    std::fs::write(p.path("in/.data.jsonl.part"), &v1).unwrap();
    std::fs::rename(p.path("in/.data.jsonl.part"), p.path("in/data.jsonl")).unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sqlite3, sys\n\
             st = os.stat(sys.argv[2])\n\
             token = '%d:%d:%d.%09d' % (st.st_dev, st.st_ino, st.st_ctime_ns // 10**9, st.st_ctime_ns % 10**9)\n\
             c = sqlite3.connect(sys.argv[1])\n\
             c.execute('UPDATE source_files SET mtime_ms = ?, change_token = ? WHERE version = 1', (st.st_mtime_ns // 10**6, token))\n\
             c.commit()",
        ])
        .arg(p.path("ledger.db"))
        .arg(p.path("in/data.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for _ in 0..2 {
        run_all(&p);
    }
    table_is(&p, &[("data.jsonl", &v1)]);
    assert_eq!(p.count("SELECT version FROM source_files WHERE id = (SELECT MIN(id) FROM source_files)"), 3);
}

/// `data.jsonl` taken in, then corrected, and one `--once` run of each stage: the correction is
/// switched in part-way (one chunk moved all of its parts and recorded its own; the others
/// have not recorded theirs yet). Returns the pipeline and both versions' text.
pub(crate) fn switched_in_part_way() -> (Pipeline, String, String) {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    let v2 = events("v2", 250, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    run_all(&p);
    (p, v1, v2)
}

/// A load killed while it switched a correction in, after it removed the old version's files
/// from the table and before it removed their `published` rows (two steps on two systems);
/// then the correction is undone. The old version's rows name files that are gone: its chunks
/// must still run again, and the table show it whole, with no chunk quarantined as missing.
/// The crash is reproduced by leaving the ledger as that instant does.
#[test]
fn a_correction_undone_after_a_crash_mid_switch_puts_the_old_version_back_whole() {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    let v2 = events("v2", 250, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    p.ledger_script("CREATE TABLE saved AS SELECT * FROM published;");
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    // The crash: version 1's rows are still there, its files are not.
    p.ledger_script("INSERT INTO published SELECT * FROM saved; DROP TABLE saved;");
    put_back(&p, &v1);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
}

/// A correction is undone while it is still being switched in: one of its chunks moved all of
/// its parts into the table and recorded its own, the others have not recorded theirs yet (a
/// `--once` run ended first, or they wait in backoff). The old version comes back whole, and the
/// parts of the undone correction that no row names do not stay in the table beside it.
#[test]
fn a_correction_undone_while_it_is_switched_in_puts_the_old_version_back_whole() {
    let (p, v1, v2) = switched_in_part_way();
    let pending = p.count("SELECT COUNT(*) FROM tasks WHERE stage = 'load' AND state <> 'done'");
    assert!(pending > 0, "the switch is under way: some of the correction's chunks have not recorded their parts");
    table_is(&p, &[("data.jsonl", &v2)]);
    // They are in backoff (a look that came while the switch was under way) until after the
    // old bytes are back in the table.
    p.ledger_script("UPDATE tasks SET scheduled_at = 9000000000000 WHERE stage = 'load' AND state <> 'done';");
    put_back(&p, &v1);
    for _ in 0..3 {
        run_all(&p);
    }
    let back =
        "SELECT COUNT(*) FROM published p JOIN chunks c ON c.id = p.chunk_id JOIN source_files f ON f.id = c.file_id WHERE f.version = 3";
    assert!(p.count(back) > 0, "the old bytes are the newest version again, published");
    p.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE scheduled_at = 9000000000000;");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
}

/// The old bytes put back in place by rename (a new inode), as a sender puts a file back.
pub(crate) fn put_back(p: &Pipeline, bytes: &str) {
    std::fs::write(p.path("in/.data.jsonl.part"), bytes).unwrap();
    std::fs::rename(p.path("in/.data.jsonl.part"), p.path("in/data.jsonl")).unwrap();
}

/// Every task done, and `ferry verify` finds the table as the ledger says.
pub(crate) fn all_done_and_verified(p: &Pipeline) {
    let stuck =
        p.sql("SELECT COUNT(*) || ' ' || COALESCE(group_concat(stage || ': ' || last_error, '; '), '') FROM tasks WHERE state <> 'done'");
    assert!(stuck.trim() == "0", "every task done: {stuck}");
    let out = p.command("ferry").arg("verify").output().unwrap();
    assert!(out.status.success(), "ferry verify: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// `ferry prune` deletes every task of a replaced version's chunks (with their attempts: a
/// file corrected every day would otherwise grow the ledger for ever); the old bytes put back
/// later still go in whole, through transform again.
#[test]
fn prune_takes_a_replaced_versions_tasks_and_its_bytes_still_come_back_whole() {
    let (p, v1) = corrected_once();
    let tasks_of = |version: i64| {
        format!(
            "SELECT COUNT(*) FROM tasks t JOIN chunks c ON c.id = t.chunk_id JOIN source_files f ON f.id = c.file_id \
             WHERE f.version = {version}"
        )
    };
    assert!(p.count(&tasks_of(1)) > 0);
    ferry_ok(&p, &["prune", "--older-than", "0s"]);
    assert_eq!(p.count(&tasks_of(1)), 0, "the replaced version's tasks went");
    let loads_of_v2 = format!("{} AND t.stage = 'load'", tasks_of(2));
    assert!(p.count(&loads_of_v2) > 0, "the published version's load tasks stay");
    assert_eq!(p.count("SELECT COUNT(*) FROM attempts a LEFT JOIN tasks t ON t.id = a.task_id WHERE t.id IS NULL"), 0);
    put_back(&p, &v1);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
}

/// A file rewritten to nothing (an empty correction) is a version too: its rows go. Another
/// empty file beside it (the same bytes) is no duplicate and no obstacle.
#[test]
fn a_correction_to_an_empty_file_removes_the_rows() {
    let p = pipeline();
    let v1 = events("v1", 200, 0..0);
    let other = events("other", 30, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    std::fs::write(p.path("in/other.jsonl"), &other).unwrap();
    std::fs::write(p.path("in/empty.jsonl"), "").unwrap();
    run_all(&p);
    table_is(&p, &[("data.jsonl", &v1), ("other.jsonl", &other)]);
    std::fs::write(p.path("in/data.jsonl"), "").unwrap();
    run_all(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    assert_eq!(p.count("SELECT COUNT(*) FROM source_files WHERE state = 'quarantined'"), 0);
    // And back: the old bytes are the newest version again.
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    run_all(&p);
    table_is(&p, &[("data.jsonl", &v1), ("other.jsonl", &other)]);
}

/// A version that puts nothing in the table (an empty file, or records all rejected) still
/// replaces the one before for good: a `ferry rerun` of the older version's chunk afterwards
/// finds the newer version in the table and stays out, although that version has no rows.
/// Before, "a newer version is in the table" meant "has rows in `published`", so the rerun
/// chunk went back in beside the empty version.
#[test]
fn a_rerun_of_a_chunk_replaced_by_a_version_with_no_rows_stays_out() {
    let (p, _, other) = data_and_other_published(300);
    let first = p.sql(
        "SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/data.jsonl' AND f.version = 1 AND c.seq = 0",
    );
    assert!(!first.is_empty());
    // Every record of the correction is bad, but not so many that a chunk is quarantined.
    let all_bad = events("v2", 3, 0..3);
    put_back(&p, &all_bad);
    settle(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    ferry_ok(&p, &["rerun", "--chunk", &first, "--from", "transform"]);
    settle(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    all_done_and_verified(&p);
    // The same with an empty file as the newest version.
    put_back(&p, "");
    settle(&p);
    ferry_ok(&p, &["rerun", "--chunk", &first, "--from", "transform"]);
    settle(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    all_done_and_verified(&p);
}

/// `ferry skip` of a chunk whose parts a sibling already moved into the table (switching their
/// version in) is refused with the reason: closing its load would leave those parts there with
/// no row naming them (`ferry verify` would find them extra). Its load records them instead.
#[test]
fn a_skip_of_a_chunk_its_version_moved_into_the_table_is_refused() {
    let (p, _, v2) = switched_in_part_way();
    let waiting = p.sql("SELECT MIN(chunk_id) FROM tasks WHERE stage = 'load' AND state <> 'done'");
    assert!(!waiting.is_empty(), "the switch is under way: a chunk of the correction has not recorded its parts");
    let out = p.command("ferry").args(["skip", "--chunk", &waiting, "--reason", "test"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "refused: {said}");
    assert!(said.contains("parts are in the table already"), "{said}");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    all_done_and_verified(&p);
}

/// A chunk whose copy was skipped keeps its Parquet in the spool until gc; when its version is
/// replaced and `ferry prune` takes every task of that version before gc ran, the spool files
/// are still found and removed (before, gc looked for them through the chunk's copy or load
/// task, and with both gone they stayed for ever).
#[test]
fn a_skipped_chunks_spool_files_go_after_prune_took_its_replaced_versions_tasks() {
    let p = pipeline();
    let v1 = events("v1", 300, 0..0);
    let v2 = events("v2", 250, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    stage_ok(&p, "ferry-extract");
    stage_ok(&p, "ferry-transform");
    let chunk = p.sql("SELECT MIN(chunk_id) FROM tasks WHERE stage = 'copy' AND state <> 'done'");
    assert!(!chunk.is_empty(), "a chunk waits for copy");
    ferry_ok(&p, &["skip", "--chunk", &chunk, "--reason", "test"]);
    settle(&p);
    let spool = p.path(&format!("spool/events/{chunk}"));
    assert!(spool.exists(), "the skipped chunk's Parquet is still in the spool (gc's cut-off has not passed)");
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    ferry_ok(&p, &["prune", "--older-than", "0s"]);
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{chunk}'")), 0, "prune took the chunk's tasks");
    ferry_ok(&p, &["gc", "--older-than", "0s"]);
    assert!(!spool.exists(), "gc removed {}", spool.display());
    table_is(&p, &[("data.jsonl", &v2)]);
    all_done_and_verified(&p);
}

/// A load that recorded its parts and was killed before it retracted the version before (or
/// whose retraction keeps failing) is not skipped: closing it would leave both versions in
/// the table. The kill is reproduced by leaving the ledger as that instant does.
#[test]
fn a_skip_of_a_load_that_recorded_its_parts_is_refused() {
    let p = Pipeline::new("1MiB", "30s", "0s").table_format(super::FORMAT);
    std::fs::write(p.path("in/data.jsonl"), events("v1", 100, 0..0)).unwrap();
    settle(&p);
    let v2 = events("v2", 120, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v2).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    let chunk = p.sql("SELECT MIN(chunk_id) FROM published");
    p.ledger_script(&format!("UPDATE tasks SET state = 'retryable', finalized_at = NULL WHERE chunk_id = '{chunk}' AND stage = 'load';"));
    let out = p.command("ferry").args(["skip", "--chunk", &chunk, "--reason", "test"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a load with rows of its own is not skipped: {said}");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    all_done_and_verified(&p);
}

/// A pipeline whose table holds `data.jsonl` (`n` records) and `other.jsonl` (30), and both
/// files' texts.
fn data_and_other_published(n: usize) -> (Pipeline, String, String) {
    let p = pipeline();
    let v1 = events("v1", n, 0..0);
    let other = events("other", 30, 0..0);
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    std::fs::write(p.path("in/other.jsonl"), &other).unwrap();
    run_all(&p);
    table_is(&p, &[("data.jsonl", &v1), ("other.jsonl", &other)]);
    (p, v1, other)
}

/// A correction that empties a file is a version with no rows: it replaces the version before
/// in the table once it is copied (the older version's chunks are withdrawn from then on), and
/// its load only removes the older rows. Skipping that load would leave them for good (before,
/// the skip went through and the older version's rows stayed visible beside the newer, empty,
/// version): it is refused, and load then empties the file's rows.
#[test]
fn a_skip_of_the_load_of_a_version_with_no_rows_is_refused() {
    let (p, _, other) = data_and_other_published(300);
    std::fs::write(p.path("in/data.jsonl"), "").unwrap();
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        stage_ok(&p, s);
    }
    let empty =
        p.sql("SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/data.jsonl' AND f.version = 2");
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{empty}' AND stage = 'load' AND state = 'available'")), 1);
    let out = p.command("ferry").args(["skip", "--chunk", &empty, "--reason", "test"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "the load of a version with no rows is not skipped: {said}");
    assert!(said.contains(&empty) && said.contains("no rows"), "{said}");
    assert_eq!(p.count("SELECT COUNT(*) FROM skips"), 0);
    stage_ok(&p, "ferry-load");
    table_is(&p, &[("other.jsonl", &other)]);
    all_done_and_verified(&p);
}

/// A version with no rows switched in stays in the table when its load is quarantined later
/// (a rerun of it that failed for good): a rerun of the version before it then stays out.
/// Before, whether an empty version was in the table was read from its load tasks, and a
/// quarantined one put the older version's rerun chunk back in the table.
#[test]
fn a_version_with_no_rows_stays_in_the_table_when_its_load_is_quarantined_later() {
    let (p, _, other) = data_and_other_published(300);
    std::fs::write(p.path("in/data.jsonl"), "").unwrap();
    settle(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    p.ledger_script(
        "UPDATE tasks SET state = 'quarantined', last_error = 'test: a later failure' WHERE stage = 'load' AND chunk_id IN
           (SELECT c.id FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/data.jsonl' AND f.version = 2);",
    );
    let old =
        p.sql("SELECT MIN(c.id) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.uri LIKE '%/data.jsonl' AND f.version = 1");
    ferry_ok(&p, &["rerun", "--chunk", &old, "--from", "transform"]);
    settle(&p);
    table_is(&p, &[("other.jsonl", &other)]);
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM tasks WHERE chunk_id = '{old}' AND state <> 'done'")), 0);
}

/// A transform killed after it wrote a chunk's Parquet to the spool and before it recorded
/// it, then the chunk skipped: a skipped transform hands nothing on (no copy task), so gc must
/// find the spool files by the transform alone (before, it looked for a finished copy, and the
/// files stayed for ever; the model test found it). The crash is reproduced by leaving the
/// ledger as that instant does: the parts written, the task not done, no copy task.
#[test]
fn a_skipped_transforms_spool_files_go_with_gc() {
    let p = pipeline();
    std::fs::write(p.path("in/data.jsonl"), events("v1", 300, 0..0)).unwrap();
    stage_ok(&p, "ferry-extract");
    stage_ok(&p, "ferry-transform");
    let chunk = p.sql("SELECT MIN(chunk_id) FROM tasks WHERE stage = 'copy'");
    p.ledger_script(&format!(
        "DELETE FROM tasks WHERE chunk_id = '{chunk}' AND stage = 'copy';
             UPDATE tasks SET state = 'retryable', finalized_at = NULL WHERE chunk_id = '{chunk}' AND stage = 'transform';"
    ));
    let spool = p.path(&format!("spool/events/{chunk}"));
    assert!(spool.exists(), "the dead attempt's Parquet is in the spool");
    ferry_ok(&p, &["gc", "--older-than", "0s"]);
    assert!(spool.exists(), "gc leaves the spool files of a transform still to run");
    ferry_ok(&p, &["skip", "--chunk", &chunk, "--reason", "test"]);
    settle(&p);
    ferry_ok(&p, &["gc", "--older-than", "0s"]);
    assert!(!spool.exists(), "gc removed {}", spool.display());
    assert_eq!(p.count(&format!("SELECT COUNT(*) FROM published WHERE chunk_id = '{chunk}'")), 0);
    assert!(files_under(&p.path("spool/events")).is_empty(), "nothing else is left in the spool");
}

/// With `versions = "keep"` a reused name is another file, but bytes taken in under that name
/// arriving there again are a redelivery: not loaded twice, and not passed over in silence
/// either (before, the second copy was deleted with nothing said or recorded). The decision is
/// logged, counted on the file's row and listed by `ferry status`; the copy sitting there under
/// `keep` is counted once, not on every pass.
#[test]
fn with_versions_kept_the_same_bytes_arriving_again_under_the_same_name_are_recorded_and_shown() {
    for disposition in ["delete", "keep"] {
        let p = pipeline();
        let cfg = std::fs::read_to_string(&p.config).unwrap();
        let setting = format!("[source]\nversions = \"keep\"\ndisposition = \"{disposition}\"\n");
        std::fs::write(&p.config, cfg.replacen("[source]\n", &setting, 1)).unwrap();
        let v1 = events("v1", 300, 0..0);
        std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
        settle(&p);
        table_is(&p, &[("data.jsonl", &v1)]);
        // The same bytes delivered again: a new file (a new inode) under the same name.
        let tmp = p.path("in/.data.jsonl.tmp");
        std::fs::write(&tmp, &v1).unwrap();
        std::fs::rename(&tmp, p.path("in/data.jsonl")).unwrap();
        let out = p.command("ferry-extract").arg("--once").env("RUST_LOG", "warn").output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{disposition}: {said}");
        assert!(said.contains("arrived again") && said.contains("data.jsonl"), "{disposition}: said: {said}");
        assert_eq!(p.count("SELECT arrived_again FROM source_files WHERE uri LIKE '%/data.jsonl'"), 1, "{disposition}");
        settle(&p);
        assert_eq!(p.count("SELECT arrived_again FROM source_files WHERE uri LIKE '%/data.jsonl'"), 1, "{disposition}: counted once");
        assert_eq!(p.count("SELECT COUNT(*) FROM source_files"), 1, "{disposition}");
        table_is(&p, &[("data.jsonl", &v1)]);
        assert_eq!(p.path("in/data.jsonl").exists(), disposition == "keep", "{disposition}: disposed of as configured");
        let status = p.command("ferry").arg("status").output().unwrap();
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(text.contains("arrived again (1x)") && text.contains("data.jsonl"), "{disposition}: status: {text}");
        let json = p.command("ferry").args(["status", "--json"]).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(v["arrived_again"][0]["times"], 1, "{disposition}: {v}");
        all_done_and_verified(&p);
    }
}

/// Runs `binary --once` with `FERRY_TEST_*_GATE` (`var`) set to a fresh directory, and waits
/// until it holds at the gate. Returns the running process and the gate.
pub(crate) fn held_at_gate(
    p: &Pipeline,
    binary: &str,
    var: &str,
    value: impl Fn(&std::path::Path) -> String,
) -> (std::process::Child, std::path::PathBuf) {
    held_at_gate_with(p, binary, &[], var, value)
}

/// [`held_at_gate`], `args` passed after `--once`.
pub(crate) fn held_at_gate_with(
    p: &Pipeline,
    binary: &str,
    args: &[&str],
    var: &str,
    value: impl Fn(&std::path::Path) -> String,
) -> (std::process::Child, std::path::PathBuf) {
    let gate = p.path(&format!("gate-{}", rand_tag()));
    std::fs::create_dir_all(&gate).unwrap();
    let child = p.command(binary).arg("--once").args(args).env(var, value(&gate)).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let t = std::time::Instant::now();
    while !gate.join("reached").exists() {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "{binary} never reached its gate");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (child, gate)
}

/// Lets a process held at `gate` go on, and waits for it to end well.
pub(crate) fn release(child: std::process::Child, gate: &std::path::Path, what: &str) {
    std::fs::write(gate.join("go"), b"").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 3), "{what}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Version 2 is copied when version 3 is switched in; version 2's load then finds itself
/// superseded and withdraws (removes its landed files). The producer puts version 2's bytes
/// back while that withdrawal is under way: they are the newest version again, and must come
/// back whole, not wait for ever on landed files the withdrawal removed.
#[test]
fn a_revert_to_a_version_whose_load_is_withdrawing_it_comes_back_whole() {
    let p = pipeline();
    let (v1, v2, v3) = (events("v1", 300, 0..0), events("v2", 250, 0..0), events("v3", 200, 0..0));
    std::fs::write(p.path("in/data.jsonl"), &v1).unwrap();
    settle(&p);
    put_back(&p, &v2);
    for s in ["ferry-extract", "ferry-transform", "ferry-copy"] {
        stage_ok(&p, s);
    }
    // Version 2's loads wait while version 3 goes in.
    p.ledger_script("UPDATE tasks SET scheduled_at = 9000000000000 WHERE stage = 'load' AND state <> 'done';");
    put_back(&p, &v3);
    for _ in 0..5 {
        run_all(&p);
        if p.count("SELECT COUNT(*) FROM tasks WHERE state NOT IN ('done', 'quarantined') AND scheduled_at < 9000000000000") == 0 {
            break;
        }
    }
    table_is(&p, &[("data.jsonl", &v3)]);
    p.ledger_script("UPDATE tasks SET scheduled_at = 0 WHERE scheduled_at = 9000000000000;");
    let (load, gate) = held_at_gate(&p, "ferry-load", "FERRY_TEST_WITHDRAW_GATE", |d| d.display().to_string());
    put_back(&p, &v2);
    stage_ok(&p, "ferry-extract");
    release(load, &gate, "the load that withdrew version 2");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    all_done_and_verified(&p);
}

/// Sets `transform.keep_staged` (the config ends in the `[transform]` section).
fn keep_staged(p: &Pipeline, how_long: &str) {
    let mut cfg = std::fs::read_to_string(&p.config).unwrap();
    cfg.push_str(&format!("keep_staged = \"{how_long}\"\n"));
    std::fs::write(&p.config, cfg).unwrap();
}

/// A correction undone a second time stages the old version's chunks anew while `ferry gc`
/// removes staged chunks past `keep_staged`: gc must not remove what the revert has just
/// staged (the version's chunks are all done in the ledger until the revert is recorded).
#[test]
fn gc_beside_a_revert_leaves_what_the_revert_staged() {
    let (p, v1) = corrected_once();
    let v2 = events("v2", 250, 0..0);
    put_back(&p, &v1);
    settle(&p);
    put_back(&p, &v2);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v2)]);
    keep_staged(&p, "0s");
    put_back(&p, &v1);
    // Held once the split's writes have ended: the chunks are staged, the revert not recorded.
    let (extract, gate) = held_at_gate(&p, "ferry-extract", "FERRY_TEST_SPLIT_GATE", |d| format!("staged:{}", d.display()));
    ferry_ok(&p, &["gc"]);
    release(extract, &gate, "the extract that put version 1 back");
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
    // What a revert cut short leaves (staged anew, never recorded) goes with gc once it is
    // old; the same name for a chunk this ledger does not know is not Ferry's to remove.
    let chunk = p.sql("SELECT id FROM chunks ORDER BY id LIMIT 1");
    let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
    let leftover = p.path(&format!("staging/events/{chunk}.v99-00000000000000ab.jsonl"));
    let foreign = p.path("staging/events/0123456789abcdef01234567.v99-00000000000000ab.jsonl");
    for f in [&leftover, &foreign] {
        std::fs::write(f, b"{}\n").unwrap();
        std::fs::File::options().write(true).open(f).unwrap().set_modified(day_ago).unwrap();
    }
    ferry_ok(&p, &["gc"]);
    assert!(!leftover.exists(), "an unrecorded revert copy of a known chunk goes");
    assert!(foreign.exists(), "a file of a chunk the ledger does not know stays");
}

/// `extract.chunk_size` changes between a version's first split and its revert: the revert
/// stages the version's chunks as they were recorded (the old cuts), and nothing that older
/// chunk rows name is overwritten or removed.
#[test]
fn a_revert_after_a_chunk_size_change_stages_the_chunks_as_recorded() {
    let (p, v1) = corrected_once();
    let v2 = events("v2", 250, 0..0);
    // Staged copies of done chunks go (the revert must stage anew), and a second cycle makes
    // the reverted version's recorded locations the revert's own names.
    keep_staged(&p, "0s");
    for (i, v) in [&v1, &v2].into_iter().enumerate() {
        put_back(&p, v);
        settle(&p);
        ferry_ok(&p, &["gc"]);
        if i == 0 {
            table_is(&p, &[("data.jsonl", &v1)]);
        }
    }
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("chunk_size = \"16KiB\"", "chunk_size = \"5KiB\"")).unwrap();
    put_back(&p, &v1);
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1)]);
    all_done_and_verified(&p);
    let chunks_of_v1 = p.count("SELECT COUNT(*) FROM chunks c JOIN source_files f ON f.id = c.file_id WHERE f.content_hash = (SELECT content_hash FROM source_files ORDER BY id LIMIT 1)");
    assert!(chunks_of_v1 >= 3, "version 1 was cut in {chunks_of_v1} chunks");
}

/// The bytes of an earlier version put back after `extract.max_record_size` was lowered below
/// their longest line: they cannot be staged again as the version's recorded chunks. Extract
/// says so, naming the file and the options, and fails that file (not the pass) every pass
/// until the options are what they were; then the version comes back whole.
#[test]
fn a_revert_that_cannot_be_cut_as_recorded_says_why_until_the_options_are_back() {
    let (p, v1) = corrected_once();
    let cfg = std::fs::read_to_string(&p.config).unwrap();
    std::fs::write(&p.config, cfg.replace("chunk_size = \"16KiB\"", "chunk_size = \"16KiB\"\nmax_record_size = \"150B\"")).unwrap();
    put_back(&p, &v1);
    std::fs::write(p.path("in/other.jsonl"), events("other", 20, 0..0).replace(&"p".repeat(60), "p")).unwrap();
    let out = p.stage("ferry-extract");
    let said = String::from_utf8_lossy(&out.stderr);
    // Another file went on in the same pass, so the run made progress (exit 0, not 4); the
    // failed file is in the log and in `ferry_files_total{outcome="failed"}`.
    assert!(out.status.code().is_some_and(|c| c == 0 || c == 4), "{said}");
    assert!(said.contains("data.jsonl") && said.contains("cannot be staged again") && said.contains("max_record_size"), "{said}");
    assert_eq!(
        p.count("SELECT COUNT(*) FROM source_files WHERE uri LIKE '%other.jsonl' AND state = 'chunked'"),
        1,
        "the other file went on"
    );
    assert_eq!(p.count("SELECT MAX(version) FROM source_files WHERE uri LIKE '%data.jsonl'"), 2, "not brought back");
    std::fs::write(&p.config, cfg).unwrap();
    settle(&p);
    table_is(&p, &[("data.jsonl", &v1), ("other.jsonl", &events("other", 20, 0..0).replace(&"p".repeat(60), "p"))]);
    all_done_and_verified(&p);
}
