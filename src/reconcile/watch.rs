//! Watches feed the owner task as messages. The Node and Machine watches are narrowed to this
//! node by field selector and report the whole (re-)listed state after every (re)connect, so a
//! Node deleted while the agent was away is still seen as absent.

use super::Msg;
use crate::api::MachineOperation;
use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc::Sender;

/// Which MachineOperations the daemon watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OperationWatch {
    /// This node's (`spec.machineRef=<node>`) and the selector-addressed ones
    /// (`spec.machineRef=`): the API server filters, through the CRD's selectable field.
    #[default]
    Selected,
    /// Every MachineOperation of the cluster, filtered by the agent (`address::addressed`):
    /// the AKS Flex Node agent's strategy, kept so that `benches/fleet.rs` measures what the
    /// selectable field buys.
    All,
}

/// What the watches received since the daemon started.
#[derive(Debug, Default)]
pub struct WatchCounters {
    /// MachineOperation objects received (listed, changed or deleted).
    pub operation_events: AtomicU64,
    /// Lists (and re-lists) completed, by every watch.
    pub lists: AtomicU64,
    /// The watches the daemon started.
    pub watches: AtomicU64,
}

impl WatchCounters {
    /// Every watch has listed once.
    pub fn synced(&self) -> bool {
        let watches = self.watches.load(Ordering::Relaxed);
        watches > 0 && self.lists.load(Ordering::Relaxed) >= watches
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Watches one named object; sends `wrap(Some)` / `wrap(None)` on every change and after
/// every re-list.
pub fn single<K>(
    api: Api<K>,
    name: &str,
    tx: Sender<Msg>,
    wrap: fn(Option<K>) -> Msg,
    counters: Arc<WatchCounters>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut listed: Option<K> = None;
        let mut told_missing = false;
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let msg = match event {
                Ok(Event::Init) => {
                    listed = None;
                    continue;
                }
                Ok(Event::InitApply(obj)) => {
                    listed = Some(obj);
                    continue;
                }
                Ok(Event::InitDone) => {
                    count(&counters.lists);
                    wrap(listed.take())
                }
                Ok(Event::Apply(obj)) => wrap(Some(obj)),
                Ok(Event::Delete(_)) => wrap(None),
                // The resource type is not served (no Machine CRD): nothing of it exists,
                // which the owner must hear once rather than wait for.
                Err(watcher::Error::InitialListFailed(kube::Error::Api(s)))
                    if s.code == 404 && !told_missing =>
                {
                    tracing::warn!(message = %s.message, "watch: the resource type is not served");
                    told_missing = true;
                    wrap(None)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "watch interrupted; retrying");
                    continue;
                }
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
    })
}

/// Watches MachineOperations selected by `fields` (server-side, via the CRD's selectable
/// fields): `spec.machineRef=<node>` for this node's, `spec.machineRef=` for selector ones;
/// none for every operation (`OperationWatch::All`).
pub fn operations(
    api: Api<MachineOperation>,
    watch: &'static str,
    fields: &str,
    tx: Sender<Msg>,
    counters: Arc<WatchCounters>,
) -> tokio::task::JoinHandle<()> {
    let mut config = watcher::Config::default();
    if !fields.is_empty() {
        config = config.fields(fields);
    }
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            let msg = match event {
                Ok(Event::Apply(op) | Event::InitApply(op)) => {
                    count(&counters.operation_events);
                    Msg::Operation(Box::new(op))
                }
                Ok(Event::Delete(op)) => {
                    count(&counters.operation_events);
                    Msg::OperationGone(op.metadata.uid.unwrap_or_default())
                }
                Ok(Event::InitDone) => {
                    count(&counters.lists);
                    Msg::OperationsListed { watch }
                }
                Ok(Event::Init) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "operation watch interrupted; retrying");
                    continue;
                }
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
    })
}
