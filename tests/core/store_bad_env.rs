//! The store in a bad environment, at the store and CLI level: truncated anywhere, emptied,
//! left half-created, on a filesystem that fills up or turns read-only (a real tmpfs), read by
//! `flexnode status`/`history`, and the daemon's refusal of a configuration it cannot use. The
//! daemon and the booted systemd: tests/cluster/daemon_bad_env.rs, tests/node/host_bad_env.rs.

use crate::support;

use flexnode::lifecycle::fault::FaultKind;
use flexnode::lifecycle::{Effect, Input, NodeState, Timestamp};
use flexnode::store::fault;
use flexnode::store::migrations::SCHEMA_VERSION;
use flexnode::store::{Store, StoreError, StoreReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::tmpfs::Tmpfs;

const T: Timestamp = Timestamp::from_millis(1_785_578_400_000);

fn flexnode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flexnode"))
        .args(args)
        .output()
        .expect("run flexnode")
}

fn kind(e: &StoreError, p: &Path) -> Option<FaultKind> {
    fault::of_store(e, p).map(|f| f.kind)
}

/// A store with some history, checkpointed: every byte in the main file.
fn store_with_history(dir: &Path) -> PathBuf {
    let p = dir.join("flexnode/state.db");
    let mut store = Store::open(&p).expect("create");
    let s = NodeState::default();
    for i in 0..40 {
        let seq = store
            .begin_step(&s, &Input::Tick, &s, &[Effect::WipeNode], T.plus_secs(i))
            .expect("step");
        store
            .finish_step(seq, "ok", None, T.plus_secs(i))
            .expect("outcome");
    }
    store.checkpoint().expect("checkpoint");
    p
}

/// Every cut is refused and leaves the file as it was, except a cut that removed only zeros:
/// SQLite reads a short last page as zero-filled, so that store lost nothing, and it opens
/// with the same state.
#[test]
fn a_store_truncated_anywhere_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = store_with_history(dir.path());
    let whole = std::fs::read(&p).expect("read");
    let state = StoreReader::open(&p).expect("read").load().expect("load");
    assert!(whole.len() >= 4 * 4096, "{} bytes", whole.len());
    // Nothing, a few bytes, inside the header, at and around every page boundary.
    let mut cuts = vec![0, 1, 16, 99, 100, 512, 4095];
    for page in (4096..whole.len()).step_by(4096) {
        cuts.extend([page - 1, page, page + 1, page + 2048]);
    }
    cuts.retain(|&c| c < whole.len());
    let (mut refused, mut lost_nothing) = (0, 0);
    for cut in &cuts {
        std::fs::write(&p, &whole[..*cut]).expect("truncate");
        if whole[*cut..].iter().all(|&b| b == 0) {
            let reader = StoreReader::open(&p).expect("a cut of zeros reads");
            assert_eq!(reader.load().expect("load"), state, "cut {cut}");
            lost_nothing += 1;
            continue;
        }
        let e = Store::open(&p).expect_err(&format!("a store cut at {cut} bytes opened"));
        assert_eq!(
            kind(&e, &p),
            Some(FaultKind::StoreCorrupt),
            "cut {cut}: {e}"
        );
        let e = StoreReader::open(&p).expect_err(&format!("a reader of a cut at {cut}"));
        assert_eq!(
            kind(&e, &p),
            Some(FaultKind::StoreCorrupt),
            "cut {cut}: {e}"
        );
        assert_eq!(
            std::fs::read(&p).expect("read"),
            &whole[..*cut],
            "cut {cut}: the file was changed"
        );
        refused += 1;
    }
    assert!(refused >= cuts.len() - 2, "{refused} of {}", cuts.len());
    println!(
        "truncations: {} cuts of a {}-byte store ({} pages): {refused} refused, {lost_nothing} \
         removed only zeros and read the same state",
        cuts.len(),
        whole.len(),
        whole.len() / 4096
    );
}

#[test]
fn an_emptied_store_is_never_started_afresh() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = store_with_history(dir.path());
    std::fs::write(&p, b"").expect("empty it");
    let e = Store::open(&p).expect_err("an empty store opened");
    assert!(e.to_string().contains("no schema"), "{e}");
    assert_eq!(
        std::fs::metadata(&p).expect("stat").len(),
        0,
        "it was initialised"
    );
}

#[test]
fn a_store_is_created_whole_and_a_half_made_one_is_discarded() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = dir.path().join("flexnode/state.db");
    std::fs::create_dir_all(p.parent().expect("dir")).expect("mkdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        p.parent().expect("dir"),
        std::fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");
    // What a creation killed half-way leaves: only the temporary name, never `state.db`.
    let half = dir.path().join("flexnode/state.db.new");
    std::fs::write(&half, b"SQLite format 3\0 and then nothing").expect("leftover");
    let store = Store::open(&p).expect("create");
    assert!(!half.exists(), "the leftover stays");
    assert_eq!(store.load().expect("load").state, NodeState::default());
    let version: i64 = rusqlite::Connection::open(&p)
        .expect("raw")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn a_full_disk_refuses_the_step_and_keeps_the_store() {
    let dir = tempfile::tempdir().expect("tmp");
    let disk = Tmpfs::mount(&dir.path().join("flexnode"), 1024);
    let p = disk.path.join("state.db");
    let mut store = Store::open(&p).expect("create");
    let s = NodeState::default();
    let seq = store
        .begin_step(&s, &Input::Tick, &s, &[Effect::WipeNode], T)
        .expect("a step with room");
    let filler = disk.fill("filler");

    // The outcome of a step that ran cannot be written: its intent stays, to be finished.
    let e = store
        .finish_step(seq, "ok", None, T.plus_secs(1))
        .expect_err("an outcome written on a full disk");
    assert_eq!(kind(&e, &p), Some(FaultKind::DiskFull), "{e}");
    // The next step's intent cannot be written: it does not start, and nothing changed.
    let before = store.load().expect("load");
    let journal = store.journal(100).expect("journal");
    let e = store
        .begin_step(&s, &Input::Tick, &s, &[Effect::WipeNode], T.plus_secs(2))
        .expect_err("an intent written on a full disk");
    assert_eq!(kind(&e, &p), Some(FaultKind::DiskFull), "{e}");
    assert_eq!(store.load().expect("load"), before);
    assert_eq!(store.journal(100).expect("journal"), journal);
    assert_eq!(
        before.pending.map(|i| i.seq),
        Some(seq),
        "the intent was lost"
    );
    // `flexnode status` still reads it, and says what is wrong.
    let out = flexnode(&["--state", &p.display().to_string(), "status"]);
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("Problem:          DiskFull: "), "{shown}");
    assert!(shown.contains("free space"), "{shown}");

    // Space returns: the same store takes the outcome and the next step; it checks whole.
    std::fs::remove_file(&filler).expect("free it");
    store.check_writable().expect("writable again");
    store
        .finish_step(seq, "ok", None, T.plus_secs(3))
        .expect("the outcome");
    store
        .begin_step(&s, &Input::Tick, &s, &[], T.plus_secs(4))
        .expect("the next step");
    drop(store);
    let reader = StoreReader::open(&p).expect("quick_check passes");
    assert_eq!(reader.load().expect("load").pending, None);
}

/// (The kernel refuses to remount a filesystem read-only while a file on it is open for
/// writing, as the store's are; errors that remount it are what the daemon meets, at its next
/// open.)
#[test]
fn a_read_only_store_is_told_apart_and_taken_up_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let disk = Tmpfs::mount(&dir.path().join("flexnode"), 1024);
    let p = disk.path.join("state.db");
    drop(Store::open(&p).expect("create"));
    disk.read_only(true);
    let e = Store::open(&p).expect_err("a writer on a read-only filesystem");
    assert_eq!(kind(&e, &p), Some(FaultKind::StoreReadOnly), "{e}");
    // A reader cannot make SQLite's WAL index on it either; status says why, not "damaged".
    let out = flexnode(&["--state", &p.display().to_string(), "status"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        shown.contains("Problem:          StoreReadOnly: "),
        "{shown}"
    );
    assert!(shown.contains("remount"), "{shown}");
    disk.read_only(false);
    let mut store = Store::open(&p).expect("writable again");
    let s = NodeState::default();
    store
        .begin_step(&s, &Input::Tick, &s, &[], T)
        .expect("a step");
}

/// `status` and `history` on a store they cannot read: what is wrong and what to do, in
/// text and JSON, exit 1, and the file left as it was.
#[test]
fn status_explains_a_store_it_cannot_read() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = store_with_history(dir.path());
    let whole = std::fs::read(&p).expect("read");
    let state = p.display().to_string();
    let mut damaged = whole.clone();
    damaged[4096..2 * 4096].fill(0xa5);
    let newer = {
        let c = rusqlite::Connection::open(&p).expect("raw");
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("bump");
        drop(c);
        let bytes = std::fs::read(&p).expect("read");
        std::fs::write(&p, &whole).expect("put back");
        bytes
    };
    for (bytes, reason, says) in [
        (damaged, "StoreCorrupt", "restore"),
        (Vec::new(), "StoreCorrupt", "flexnode reset --yes"),
        (newer, "StoreSchemaTooNew", "newer flexnode"),
    ] {
        std::fs::write(&p, &bytes).expect("write");
        for cmd in ["status", "history"] {
            let out = flexnode(&["--state", &state, cmd]);
            let shown = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(1), "{cmd} {reason}: {shown}");
            assert!(
                shown.contains(&format!("Problem:          {reason}: ")),
                "{cmd}: {shown}"
            );
            assert!(
                shown.contains("What to do:") && shown.contains(says),
                "{shown}"
            );
            assert!(shown.contains("Phase:            Unknown"), "{shown}");
            assert!(
                String::from_utf8_lossy(&out.stderr).contains(reason),
                "{out:?}"
            );
        }
        let out = flexnode(&["--state", &state, "status", "-o", "json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(json["phase"], "Unknown", "{json}");
        assert_eq!(json["problems"][0]["reason"], reason, "{json}");
        assert_eq!(json["problems"][0]["transient"], false, "{json}");
        assert_eq!(
            std::fs::read(&p).expect("read"),
            bytes,
            "status changed the file"
        );
    }
}

/// The daemon's configuration missing, garbled or impossible: exit 78 (not restarted by its
/// unit), the reason on stderr, before anything else is touched.
#[test]
fn the_daemon_refuses_a_configuration_it_cannot_use_with_78() {
    let dir = tempfile::tempdir().expect("tmp");
    let config = dir.path().join("config.yaml");
    let state = dir.path().join("state/state.db");
    let run = || {
        flexnode(&[
            "--state",
            &state.display().to_string(),
            "daemon",
            "--config",
            &config.display().to_string(),
        ])
    };
    for (contents, reason) in [
        (None, "ConfigMissing"),
        (Some(vec![0xff, 0xfe, 0x00, 0x80]), "ConfigUnreadable"),
        (Some(b"nodeName: Not_A_Name\n".to_vec()), "ConfigInvalid"),
    ] {
        if let Some(c) = &contents {
            std::fs::write(&config, c).expect("write");
        }
        let out = run();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{reason}: {err}");
        assert!(err.contains(&format!("{reason}: ")), "{err}");
        assert!(
            err.contains(&format!("reason={reason}")),
            "the log line: {err}"
        );
        assert!(!state.exists(), "{reason}: a store was made");
    }
}
