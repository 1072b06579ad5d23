//! What the API server said about every MachineOperation, for checks on the whole history of
//! an operation instead of a final read: a watch of the admin's that records each state it
//! delivers (through outages: it lists again when it must, and says how often), the Events
//! of each operation, and the agents' status writes as the API server's audit log recorded
//! them (`Lab::up_audited`), which no outage interrupts.

use super::Lab;
pub use super::recording::Seen;
use super::recording::{Recording, State, operation, record};
use flexnode::api::MachineOperation;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Client;
use kube::api::Api;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The recording watch (tests/support/recording.rs); it stops when dropped.
pub struct History {
    recorded: Arc<Mutex<Recording<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    /// Starts recording every MachineOperation of the cluster.
    pub fn record(admin: Client) -> Self {
        let recorded: Arc<Mutex<Recording<Seen>>> = Arc::default();
        let sink = recorded.clone();
        let api: Api<MachineOperation> = Api::all(admin);
        let task = tokio::spawn(record(api, operation, move |told| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).keep(told);
        }));
        Self { recorded, task }
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Recording<Seen>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every state `name` was seen in, oldest first.
    pub fn of(&self, name: &str) -> Vec<Seen> {
        self.recorded()
            .by_name
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    /// How often the watch listed again after its first list.
    pub fn relists(&self) -> u32 {
        self.recorded().relists
    }

    /// The first terminal state of `name`, once seen.
    pub fn terminal(&self, name: &str) -> Option<Seen> {
        self.of(name).into_iter().find(Seen::terminal)
    }

    /// Waits until `name` was seen in a state `want` accepts.
    pub async fn wait(
        &self,
        name: &str,
        limit: std::time::Duration,
        want: impl Fn(&Seen) -> bool,
    ) -> Seen {
        super::wait_for(limit, || async { self.of(name).into_iter().find(&want) })
            .await
            .unwrap_or_else(|| panic!("{name} was never seen so; seen: {:#?}", self.of(name)))
    }

    /// The whole history of `name` is one operation (one UID) that went through pending
    /// states, then `InProgress`, then exactly one terminal result that never changed again
    /// (`Seen::violations`); that result.
    pub fn one_result(&self, name: &str) -> Seen {
        let states = self.of(name);
        let uids: std::collections::BTreeSet<&str> =
            states.iter().map(|s| s.uid.as_str()).collect();
        assert_eq!(uids.len(), 1, "{name}: more than one object: {states:#?}");
        let bad = Seen::violations(&states);
        assert!(bad.is_empty(), "{name}: {bad:?}: {states:#?}");
        states
            .into_iter()
            .find(Seen::terminal)
            .unwrap_or_else(|| panic!("{name}: no terminal state"))
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Events recorded for the operation `uid`: reason → how many times it happened (an
/// Event repeated by its series counts its series).
pub async fn events(admin: &Client, uid: &str) -> BTreeMap<String, i32> {
    let api: Api<K8sEvent> = Api::all(admin.clone());
    let list = api.list(&Default::default()).await.expect("list Events");
    let mut by = BTreeMap::new();
    for e in list.items {
        if e.regarding.as_ref().and_then(|r| r.uid.as_deref()) != Some(uid) {
            continue;
        }
        let n = e.series.as_ref().map_or(1, |s| s.count);
        *by.entry(e.reason.unwrap_or_default()).or_insert(0) += n;
    }
    by
}

/// One status write the API server accepted, from its audit log.
#[derive(Clone, Debug)]
pub struct StatusWrite {
    /// `requestReceivedTimestamp`.
    pub at: k8s_openapi::jiff::Timestamp,
    pub user: String,
}

/// The status writes of MachineOperation `name` the API server accepted (code 2xx), oldest
/// first: the audit log (`Lab::up_audited`) keeps every one across restarts of the API
/// server, which appends to it.
pub fn status_writes(lab: &Lab, name: &str) -> Vec<StatusWrite> {
    let text = std::fs::read(lab.dir.join("logs/audit.log")).expect("the audit log");
    let mut writes = Vec::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let object = &e["objectRef"];
        let accepted = e["responseStatus"]["code"]
            .as_i64()
            .is_some_and(|c| (200..300).contains(&c));
        if e["stage"] != "ResponseComplete"
            || !matches!(e["verb"].as_str(), Some("update" | "patch"))
            || object["resource"] != "machineoperations"
            || object["subresource"] != "status"
            || object["name"] != name
            || !accepted
        {
            continue;
        }
        let at = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .expect("requestReceivedTimestamp");
        writes.push(StatusWrite {
            at,
            user: e["user"]["username"].as_str().unwrap_or_default().into(),
        });
    }
    writes
}
