//! Watches feed the owner task as messages. The Node and Machine watches are narrowed to this
//! node by field selector and report the whole (re-)listed state after every (re)connect, so a
//! Node deleted while the agent was away is still seen as absent.
//!
//! After any failure a watch starts again from a fresh list, never from the resourceVersion it
//! had: an API server back on a restored or wiped etcd accepts an old resourceVersion without
//! a 410 and sends only what comes after it (kube-apiserver's watch cache), so a resumed watch
//! would miss every object written since. The list is also how objects deleted while the
//! agent was away are noticed: an operation missing from it is gone.

use super::Msg;
use crate::api::MachineOperation;
use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use serde::de::DeserializeOwned;
use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
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
    /// Interruptions: a watch failed (the API server away, a broken stream, a 410) after it
    /// had listed; counted once until it lists again.
    pub interruptions: AtomicU64,
    /// Re-lists that ended an interruption.
    pub resyncs: AtomicU64,
    /// Watches interrupted now: the owner claims nothing while one is (`owner.rs`).
    pub away: AtomicU64,
    /// Told when a watch lists again after an interruption: the API server is back, so the
    /// others waiting out their backoff (up to 30 s) try again at once.
    pub back: tokio::sync::Notify,
}

impl WatchCounters {
    /// Every watch has listed once.
    pub fn synced(&self) -> bool {
        let watches = self.watches.load(Ordering::Relaxed);
        watches > 0 && self.lists.load(Ordering::Relaxed) >= watches
    }

    /// No watch is interrupted.
    pub fn connected(&self) -> bool {
        self.away.load(Ordering::Relaxed) == 0
    }
}

fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One watch's connection, as the daemon accounts for it: the first failure of an
/// interruption is logged and counted (the retries only at debug level), and the re-list that
/// ends it says how long the watch was away.
struct Link {
    node: String,
    watch: &'static str,
    counters: Arc<WatchCounters>,
    /// Since when, and after how many failed attempts, while interrupted.
    away: Option<(Instant, u64)>,
    backoff: DefaultBackoff,
}

impl Link {
    fn new(node: &str, watch: &'static str, counters: Arc<WatchCounters>) -> Self {
        Self {
            node: node.to_string(),
            watch,
            counters,
            away: None,
            backoff: DefaultBackoff::default(),
        }
    }

    /// The watch failed: a fresh one starts after the backoff.
    async fn failed(&mut self, e: &watcher::Error) {
        match &mut self.away {
            Some((_, failures)) => {
                *failures += 1;
                tracing::debug!(node = %self.node, watch = %self.watch, error = %e, "watch still interrupted");
            }
            None => {
                self.away = Some((Instant::now(), 1));
                count(&self.counters.interruptions);
                count(&self.counters.away);
                tracing::warn!(
                    node = %self.node,
                    watch = %self.watch,
                    error = %e,
                    "watch interrupted; it lists again once the API server answers"
                );
            }
        }
        let pause = self
            .backoff
            .next()
            .unwrap_or(std::time::Duration::from_secs(30));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = self.counters.back.notified() => {}
        }
    }

    /// A list completed: the watch is whole again.
    fn listed(&mut self) {
        count(&self.counters.lists);
        crate::metrics::api_contact();
        self.backoff.reset();
        if let Some((since, failures)) = self.away.take() {
            count(&self.counters.resyncs);
            crate::metrics::watch_reconnected(self.watch);
            self.counters.away.fetch_sub(1, Ordering::Relaxed);
            self.counters.back.notify_waiters();
            tracing::info!(
                node = %self.node,
                watch = %self.watch,
                away_ms = since.elapsed().as_millis() as u64,
                failures,
                "watch resynced"
            );
        }
    }

    /// A change arrived on an established watch.
    fn progressed(&mut self) {
        crate::metrics::api_contact();
        self.backoff.reset();
    }
}

/// Watches one named object (`watch` names the watch in the daemon's log); sends
/// `wrap(Some)` / `wrap(None)` on every change and after every list.
pub fn single<K>(
    api: Api<K>,
    name: &str,
    watch: &'static str,
    tx: Sender<Msg>,
    wrap: fn(Option<K>) -> Msg,
    counters: Arc<WatchCounters>,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut link = Link::new(name, watch, counters);
    tokio::spawn(async move {
        let mut told_missing = false;
        loop {
            let mut listed: Option<K> = None;
            let mut stream = watcher::watcher(api.clone(), config.clone()).boxed();
            let error = loop {
                let msg = match stream.next().await {
                    Some(Ok(Event::Init)) => {
                        listed = None;
                        continue;
                    }
                    Some(Ok(Event::InitApply(obj))) => {
                        listed = Some(obj);
                        continue;
                    }
                    Some(Ok(Event::InitDone)) => {
                        link.listed();
                        told_missing = false;
                        wrap(listed.take())
                    }
                    Some(Ok(Event::Apply(obj))) => {
                        link.progressed();
                        wrap(Some(obj))
                    }
                    Some(Ok(Event::Delete(_))) => {
                        link.progressed();
                        wrap(None)
                    }
                    // The resource type is not served (no Machine CRD): nothing of it exists,
                    // which the owner must hear once rather than wait for. That is a list, of
                    // nothing; the type is asked for again after the backoff.
                    Some(Err(watcher::Error::InitialListFailed(kube::Error::Api(s))))
                        if s.code == 404 =>
                    {
                        link.listed();
                        if !told_missing {
                            tracing::warn!(message = %s.message, "watch: the resource type is not served");
                            told_missing = true;
                            if tx.send(wrap(None)).await.is_err() {
                                return;
                            }
                        }
                        let pause = link.backoff.next().unwrap_or_default();
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    Some(Err(e)) => break e,
                    None => return,
                };
                if tx.send(msg).await.is_err() {
                    return;
                }
            };
            link.failed(&error).await;
        }
    })
}

/// Watches MachineOperations selected by `fields` (server-side, via the CRD's selectable
/// fields): `spec.machineRef=<node>` for this node's, `spec.machineRef=` for selector ones;
/// none for every operation (`OperationWatch::All`). An operation a list no longer holds was
/// deleted while the watch was away: it is reported gone.
pub fn operations(
    api: Api<MachineOperation>,
    node: &str,
    watch: &'static str,
    fields: &str,
    tx: Sender<Msg>,
    counters: Arc<WatchCounters>,
) -> tokio::task::JoinHandle<()> {
    let mut config = watcher::Config::default();
    if !fields.is_empty() {
        config = config.fields(fields);
    }
    let mut link = Link::new(node, watch, counters.clone());
    tokio::spawn(async move {
        // The UIDs this watch has reported and not yet reported gone.
        let mut known: HashSet<String> = HashSet::new();
        loop {
            let mut fresh: HashSet<String> = HashSet::new();
            let mut stream = watcher::watcher(api.clone(), config.clone()).boxed();
            let error = loop {
                let msgs = match stream.next().await {
                    Some(Ok(Event::Init)) => {
                        fresh.clear();
                        continue;
                    }
                    Some(Ok(Event::InitApply(op))) => {
                        count(&counters.operation_events);
                        if let Some(uid) = &op.metadata.uid {
                            fresh.insert(uid.clone());
                        }
                        vec![Msg::Operation(Box::new(op))]
                    }
                    Some(Ok(Event::Apply(op))) => {
                        link.progressed();
                        count(&counters.operation_events);
                        if let Some(uid) = &op.metadata.uid {
                            known.insert(uid.clone());
                        }
                        vec![Msg::Operation(Box::new(op))]
                    }
                    Some(Ok(Event::Delete(op))) => {
                        link.progressed();
                        count(&counters.operation_events);
                        let uid = op.metadata.uid.unwrap_or_default();
                        known.remove(&uid);
                        vec![Msg::OperationGone(uid)]
                    }
                    Some(Ok(Event::InitDone)) => {
                        link.listed();
                        let gone: Vec<String> = known.difference(&fresh).cloned().collect();
                        if !gone.is_empty() {
                            tracing::info!(
                                node = %link.node,
                                watch = %watch,
                                gone = gone.len(),
                                "operations deleted while the watch was away"
                            );
                        }
                        known = std::mem::take(&mut fresh);
                        let mut msgs: Vec<Msg> = gone.into_iter().map(Msg::OperationGone).collect();
                        msgs.push(Msg::OperationsListed { watch });
                        msgs
                    }
                    Some(Err(e)) => break e,
                    None => return,
                };
                for msg in msgs {
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
            };
            // In the owner's order: it claims nothing more until this watch's next list.
            if link.away.is_none() && tx.send(Msg::OperationsStale { watch }).await.is_err() {
                return;
            }
            link.failed(&error).await;
        }
    })
}
