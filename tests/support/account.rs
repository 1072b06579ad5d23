//! What a node's store holds, read from outside the daemon: the results its outbox has not
//! published yet and its whole journal, for checks that nothing was lost or done twice.

use super::hostnode::HostNode;
use flexnode::store::StoreReader;
use std::path::Path;

/// What the store holds: results not yet published, and the journal (every entry: its
/// number, input and outcome).
pub struct StoreAccount {
    pub unpublished: Vec<String>,
    pub journal: Vec<(i64, String, Option<String>)>,
}

/// A simulated node's store, read as `flexnode status` and `history` read it, the outbox as
/// the executor does (src/store/operations.rs).
pub fn store_account(path: &Path) -> StoreAccount {
    let reader = StoreReader::open(path).expect("open the store");
    let journal = reader
        .journal(i64::MAX)
        .expect("the journal")
        .into_iter()
        .map(|e| (e.seq, e.input, e.outcome))
        .collect();
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .expect("open the store");
    let mut stmt = conn
        .prepare(
            "SELECT name FROM operations WHERE result_reason IS NOT NULL AND published_at IS NULL",
        )
        .expect("query");
    let unpublished = stmt
        .query_map([], |r| r.get(0))
        .expect("outbox")
        .collect::<Result<Vec<String>, _>>()
        .expect("outbox rows");
    StoreAccount {
        unpublished,
        journal,
    }
}

/// When a simulated node's store journaled the first step whose input names `what`
/// (e.g. `OperationClaimed(NodeReboot r1)`), in unix milliseconds of the daemon's clock.
pub fn journaled_at(path: &Path, what: &str) -> Option<i64> {
    StoreReader::open(path)
        .expect("open the store")
        .journal(i64::MAX)
        .expect("the journal")
        .into_iter()
        .find(|e| e.input.contains(what))
        .map(|e| e.at.millis())
}

/// The real host's store, through its own `flexnode history` and `status` (its one result
/// is the last one).
pub fn host_store_account(host: &HostNode) -> StoreAccount {
    let run = |args: &[&str]| -> serde_json::Value {
        let out = host.container.exec(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let flexnode = "/opt/flexnode/bin/flexnode";
    let history = run(&[flexnode, "history", "--limit", "100000", "-o", "json"]);
    let journal = history["entries"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| {
            (
                e["seq"].as_i64().expect("seq"),
                e["input"].as_str().unwrap_or_default().to_string(),
                e["outcome"].as_str().map(str::to_string),
            )
        })
        .collect();
    let status = run(&[flexnode, "status", "-o", "json"]);
    let last = &status["lastResult"];
    let unpublished = if last["published"] == true {
        Vec::new()
    } else {
        vec![last["operation"].as_str().unwrap_or_default().to_string()]
    };
    StoreAccount {
        unpublished,
        journal,
    }
}

impl StoreAccount {
    /// The journal is whole: numbered without a gap, every step's outcome recorded.
    pub fn intact(&self, what: &str) {
        for pair in self.journal.windows(2) {
            assert_eq!(pair[1].0, pair[0].0 + 1, "{what}: a journal gap: {pair:?}");
        }
        for e in &self.journal {
            assert!(e.2.is_some(), "{what}: a step without outcome: {e:?}");
        }
        assert!(
            self.unpublished.is_empty(),
            "{what}: results still in the outbox: {:?}",
            self.unpublished
        );
    }

    /// Journal entries whose input names `what` (e.g. `OperationClaimed(NodeReboot r1)`).
    pub fn inputs(&self, what: &str) -> usize {
        self.journal.iter().filter(|e| e.1.contains(what)).count()
    }
}
