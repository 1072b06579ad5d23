//! Target `store`: arbitrary bytes as the database file (`src/store/`), opened as `flexnode
//! status` opens it (`StoreReader`, then the status report `flexnode::status_report`) and as the
//! daemon does (`Store::open`, then what a start reads). Either the store loads, or a typed
//! error says it is damaged; the writer never opens what the reader calls damaged, never
//! changes a file it refuses, and never takes a damaged journal for a fresh node.
//!
//! Input: the database file.

use crate::common::{Outcome, fresh_dir};
use flexnode::status_report;
use flexnode::store::{Store, StoreError, StoreReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub fn check(data: &[u8], scratch: &Path) -> Outcome {
    let dir = scratch.join("store");
    fresh_dir(&dir);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let db = dir.join("state.db");
    std::fs::write(&db, data).expect("write the store");
    let facts = Facts::of(&db);

    let read = read(&db);
    let before = std::fs::read(&db).expect("read the store");
    let opened = Store::open(&db);
    let outcome = Outcome::from(&opened);
    match opened {
        Ok(store) => {
            if let Err(e) = &read {
                let fresh =
                    matches!(e, StoreError::Corrupt { detail, .. } if detail == "no schema");
                assert!(
                    fresh,
                    "the daemon opened a store `flexnode status` refuses: {e}"
                );
            }
            let loaded = store.load();
            if let Ok(p) = &loaded {
                // A store whose node row is gone but whose journal is not is damage, never a
                // node that never joined (`fuzz/regressions/store/`).
                assert!(
                    !(facts.journal_rows > 0 && !facts.node_row && p.state.node().is_none()),
                    "a store with a journal but no node row loads as a node that never joined"
                );
                let again = store.load().expect("a store that loaded loads again");
                assert_eq!(p, &again);
                if let Ok(Some(r)) = &read {
                    assert_eq!(
                        &p.state, r,
                        "the daemon and `flexnode status` read different states"
                    );
                }
            }
            let _ = store.unpublished();
            let _ = store.agent_images();
            let _ = store.journal(50);
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(!shown.is_empty());
            let after = std::fs::read(&db).unwrap_or_default();
            assert!(before == after, "a refused store was changed ({e})");
        }
    }
    outcome
}

/// What `flexnode status` reads: the state when the store loads.
fn read(db: &Path) -> Result<Option<flexnode::lifecycle::NodeState>, StoreError> {
    let reader = StoreReader::open(db)?;
    let loaded = reader.load();
    let _ = reader.journal(50);
    let _ = reader.last_result();
    let _ = reader.node_seen();
    if let Ok(r) = status_report::build(&reader) {
        let _ = status_report::render_human(&r);
        serde_json::to_string(&r).expect("the status report encodes");
    }
    match loaded {
        Ok(p) => {
            let json = serde_json::to_string(&p.state).expect("encode the state");
            let back: flexnode::lifecycle::NodeState = serde_json::from_str(&json).expect("decode");
            assert_eq!(back, p.state);
            Ok(Some(p.state))
        }
        Err(_) => Ok(None),
    }
}

/// The file as SQLite itself reads it, apart from the agent's code.
struct Facts {
    node_row: bool,
    journal_rows: i64,
}

impl Facts {
    fn of(db: &Path) -> Self {
        let copy = db.with_extension("facts");
        let _ = std::fs::copy(db, &copy);
        let facts = rusqlite::Connection::open_with_flags(
            &copy,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .ok()
        .map(|c| Self {
            node_row: c
                .query_row("SELECT count(*) FROM node WHERE id = 1", [], |r| {
                    r.get::<_, i64>(0)
                })
                .is_ok_and(|n| n > 0),
            journal_rows: c
                .query_row("SELECT count(*) FROM journal", [], |r| r.get(0))
                .unwrap_or(0),
        });
        let _ = std::fs::remove_file(&copy);
        facts.unwrap_or(Self {
            node_row: false,
            journal_rows: 0,
        })
    }
}
