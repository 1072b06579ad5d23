//! The SQLite store: migrations, intent/outcome, a second writer, crashes, damaged files.

use flexnode::lifecycle::result::{OpResult, ResultReason};
use flexnode::lifecycle::state::OpRef;
use flexnode::lifecycle::{Effect, Input, NodeState, Timestamp};
use flexnode::store::migrations::SCHEMA_VERSION;
use flexnode::store::{Store, StoreError, StoreReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

const T: Timestamp = Timestamp::from_millis(1_785_578_400_000);

fn path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("flexnode/state.db")
}

/// The store's directory as the store would make it (0700), for files written before it opens.
fn private_parent(p: &std::path::Path) {
    let dir = p.parent().expect("dir");
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
}

#[test]
fn creates_private_files_and_migrates_an_empty_store() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let store = Store::open(&p).expect("open");
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&p), 0o600);
    assert_eq!(mode(p.parent().expect("dir")), 0o700);
    let version: i64 = rusqlite::Connection::open(&p)
        .expect("raw")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let mode_wal: String = rusqlite::Connection::open(&p)
        .expect("raw")
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .expect("mode");
    assert_eq!(mode_wal, "wal");
    assert_eq!(store.load().expect("load").state, NodeState::default());
    drop(store);
    // Reopening an up-to-date store changes nothing.
    let store = Store::open(&p).expect("reopen");
    assert_eq!(store.load().expect("load").pending, None);
}

#[test]
fn a_second_writer_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let _first = Store::open(&p).expect("open");
    let err = Store::open(&p).expect_err("second writer");
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    assert!(err.to_string().contains("only one writer"));
    // Readers are fine while the writer holds the store.
    StoreReader::open(&p).expect("reader");
}

#[test]
fn refuses_a_directory_others_can_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path().join("open");
    std::fs::create_dir(&d).expect("mkdir");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let err = Store::open(&d.join("state.db")).expect_err("insecure");
    assert!(matches!(err, StoreError::InsecureDirectory(_)), "{err}");
}

/// A private directory of another user is theirs to put a store of their choosing in.
#[test]
fn refuses_a_directory_another_user_owns() {
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path().join("theirs");
    std::fs::create_dir(&d).expect("mkdir");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::os::unix::fs::chown(&d, Some(65534), Some(65534)).expect("chown (the tests run as root)");
    let err = Store::open(&d.join("state.db")).expect_err("foreign");
    assert!(
        matches!(err, StoreError::ForeignDirectory { owner: 65534, .. }),
        "{err}"
    );
    assert!(!d.join("state.db").exists(), "nothing was created in it");
}

#[test]
fn intent_is_kept_until_the_outcome_is_recorded() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let mut store = Store::open(&p).expect("open");
    let from = NodeState::default();
    let effects = vec![Effect::WipeNode];
    let seq = store
        .begin_step(&from, &Input::ResetRequested, &from, &effects, T)
        .expect("intent");
    drop(store);
    let store = Store::open(&p).expect("reopen");
    let loaded = store.load().expect("load");
    let intent = loaded.pending.expect("intent survives");
    assert_eq!((intent.seq, intent.at, intent.effects), (seq, T, effects));
    assert_eq!(store.journal(10).expect("journal")[0].outcome, None);
    let mut store = store;
    store
        .finish_step(seq, "ok", Some(&Input::EffectsDone), T.plus_secs(1))
        .expect("outcome");
    assert_eq!(store.load().expect("load").pending, None);
    assert_eq!(
        store.journal(10).expect("journal")[0].outcome.as_deref(),
        Some("ok")
    );
    // The outcome waits, across a reopen, until the next step is begun on it.
    drop(store);
    let mut store = Store::open(&p).expect("reopen");
    assert_eq!(store.load().expect("load").report, Some(Input::EffectsDone));
    store
        .begin_step(&from, &Input::EffectsDone, &from, &[], T.plus_secs(2))
        .expect("next step");
    assert_eq!(store.load().expect("load").report, None);
}

#[test]
fn the_journal_is_append_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let mut store = Store::open(&p).expect("open");
    let s = NodeState::default();
    store
        .begin_step(&s, &Input::Tick, &s, &[], T)
        .expect("step");
    drop(store);
    let raw = rusqlite::Connection::open(&p).expect("raw");
    assert!(raw.execute("DELETE FROM journal", []).is_err());
    assert!(
        raw.execute("UPDATE journal SET outcome = 'forged'", [])
            .is_err()
    );
}

#[test]
fn results_wait_in_the_outbox_until_published() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut store = Store::open(&path(&dir)).expect("open");
    let op = OpRef {
        name: "op".into(),
        uid: "u1".into(),
    };
    let result = OpResult {
        reason: ResultReason::Succeeded,
        message: "NodeReboot completed".into(),
        started_at: T,
        machine_generation: 3,
    };
    // A result enters the outbox with the intent of the step that decides it.
    let publish = |result: &OpResult| {
        vec![Effect::PublishResult {
            op: op.clone(),
            result: result.clone(),
        }]
    };
    let s = NodeState::default();
    store
        .begin_step(&s, &Input::Tick, &s, &publish(&result), T)
        .expect("record");
    // The first result recorded for a UID wins.
    let other = OpResult {
        reason: ResultReason::ExecutionFailed,
        ..result.clone()
    };
    store
        .begin_step(&s, &Input::Tick, &s, &publish(&other), T.plus_secs(5))
        .expect("record again");
    let waiting = store.unpublished().expect("outbox");
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].result, result);
    store
        .mark_published("u1", T.plus_secs(1))
        .expect("published");
    assert!(store.unpublished().expect("outbox").is_empty());
    assert_eq!(
        store
            .result_for("u1")
            .expect("get")
            .and_then(|r| r.published_at),
        Some(T.plus_secs(1))
    );
}

/// A committed step, then a second process (Python's sqlite3, so no test of this binary is
/// its helper) writes inside a transaction and is killed by SIGKILL before it commits.
#[test]
fn reopens_after_an_abrupt_exit_mid_transaction() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let mut store = Store::open(&p).expect("create");
    let s = NodeState::default();
    store
        .begin_step(&s, &Input::Tick, &s, &[], T)
        .expect("committed step");
    drop(store);
    const CHILD: &str = r#"
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE node SET state = 'half-written' WHERE id = 1")
db.execute("INSERT INTO journal (at, from_state, input, to_state, effects) VALUES (1, 'a', 'b', 'c', '[]')")
print("written", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", CHILD])
        .arg(&p)
        .output()
        .expect("run python3");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(9),
        "the child must die by SIGKILL after writing: {out:?}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "written");
    let store = Store::open(&p).expect("reopen after crash");
    assert_eq!(store.load().expect("load").state, NodeState::default());
    let journal = store.journal(10).expect("journal");
    assert_eq!(journal.len(), 1, "only the committed step: {journal:?}");
}

#[test]
fn a_file_that_is_not_a_database_is_reported_not_guessed() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    private_parent(&p);
    std::fs::write(&p, b"this is not sqlite, just text that happens to be here").expect("write");
    let err = Store::open(&p).expect_err("garbage");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    let err = StoreReader::open(&p).expect_err("garbage");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("damaged"));
}

#[test]
fn a_truncated_store_is_reported_not_guessed() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    let mut store = Store::open(&p).expect("open");
    let s = NodeState::default();
    for i in 0..200 {
        store
            .begin_step(&s, &Input::Tick, &s, &[Effect::WipeNode], T.plus_secs(i))
            .expect("step");
    }
    store.checkpoint().expect("checkpoint");
    drop(store);
    let len = std::fs::metadata(&p).expect("stat").len();
    assert!(len > 8192, "store too small to truncate: {len}");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(len / 2).expect("truncate");
    let err = Store::open(&p).expect_err("truncated");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
}

#[test]
fn a_state_row_that_does_not_decode_is_reported() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    drop(Store::open(&p).expect("create"));
    rusqlite::Connection::open(&p)
        .expect("raw")
        .execute("UPDATE node SET state = '{\"state\":\"flying\"}'", [])
        .expect("write");
    let store = Store::open(&p).expect("open");
    let err = store.load().expect_err("bad state");
    assert!(err.to_string().contains("does not decode"), "{err}");
}

#[test]
fn a_store_from_a_newer_flexnode_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    drop(Store::open(&p).expect("create"));
    rusqlite::Connection::open(&p)
        .expect("raw")
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    let err = Store::open(&p).expect_err("too new");
    assert!(err.to_string().contains("newer"), "{err}");
}

#[test]
fn migrates_a_schema_1_store_keeping_its_state() {
    use flexnode::store::migrations::MIGRATIONS;
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    private_parent(&p);
    {
        let raw = rusqlite::Connection::open(&p).expect("raw");
        raw.execute_batch(MIGRATIONS[0]).expect("schema 1");
        raw.pragma_update(None, "user_version", 1).expect("version");
        raw.execute(
            "INSERT INTO node (id, state, updated_at) VALUES (1, '{\"state\":\"unjoined\",\"finished\":[\"u-old\"]}', 5)",
            [],
        )
        .expect("row");
    }
    let store = Store::open(&p).expect("migrate");
    let version: i64 = rusqlite::Connection::open(&p)
        .expect("raw")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    let state = store.load().expect("load").state;
    assert!(format!("{state:?}").contains("u-old"), "{state:?}");
    let d = "ab".repeat(32);
    assert!(!store.is_agent_image(&d).expect("query"));
    store
        .record_agent_image(&d, "r.example/a@sha256:x", T)
        .expect("record");
    assert!(store.is_agent_image(&d).expect("query"));
    store.forget_agent_image(&d).expect("forget");
    assert!(!store.is_agent_image(&d).expect("query"));
}

/// The last-seen Node is one row, replaced; a reader of a store not yet migrated to schema 3
/// sees none instead of failing (`flexnode status` must always work).
#[test]
fn the_node_as_last_seen_is_one_row_and_optional_for_an_older_store() {
    use flexnode::store::migrations::MIGRATIONS;
    let dir = tempfile::tempdir().expect("tmp");
    let p = path(&dir);
    private_parent(&p);
    {
        let raw = rusqlite::Connection::open(&p).expect("raw");
        raw.execute_batch(MIGRATIONS[0]).expect("schema 1");
        raw.execute_batch(MIGRATIONS[1]).expect("schema 2");
        raw.pragma_update(None, "user_version", 2).expect("version");
        raw.execute(
            "INSERT INTO node (id, state, updated_at) VALUES (1, '{\"state\":\"unjoined\",\"finished\":[]}', 5)",
            [],
        )
        .expect("row");
    }
    let reader = flexnode::store::StoreReader::open(&p).expect("reader");
    assert_eq!(reader.node_seen().expect("schema 2"), None);
    drop(reader);
    let store = Store::open(&p).expect("migrate");
    store
        .record_node_seen(r#"{"ready":"False"}"#, T)
        .expect("first");
    store
        .record_node_seen(r#"{"ready":"True"}"#, T.plus_secs(1))
        .expect("second");
    let reader = flexnode::store::StoreReader::open(&p).expect("reader");
    assert_eq!(
        reader.node_seen().expect("read"),
        Some((r#"{"ready":"True"}"#.to_string(), T.plus_secs(1)))
    );
}

/// The drain's record (intent before the cordon) survives a resumed drain; another holder's
/// drain starts a record of its own.
#[test]
fn a_resumed_drain_keeps_its_record_and_a_new_one_replaces_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&path(&dir)).expect("store");
    assert_eq!(store.cordon().expect("read"), None);
    let t = T;
    store.begin_drain("operation/a", t).expect("begin");
    store.mark_cordoned("operation/a").expect("mark");
    store
        .record_drain_progress("2 pods left")
        .expect("progress");
    let resumed = store
        .begin_drain("operation/a", Timestamp::from_millis(9_000))
        .expect("resume");
    assert!(resumed.cordoned && resumed.since == t && resumed.progress == "2 pods left");
    let other = store
        .begin_drain("operation/b", Timestamp::from_millis(9_000))
        .expect("another");
    assert!(!other.cordoned && other.holder == "operation/b" && other.progress.is_empty());
    store
        .mark_cordoned("operation/a")
        .expect("a stale holder marks nothing");
    assert!(!store.cordon().expect("read").expect("kept").cordoned);
    store.forget_cordon().expect("forget");
    assert_eq!(store.cordon().expect("read"), None);
}
