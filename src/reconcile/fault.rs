//! The daemon in a bad environment (src/lifecycle/fault.rs names the faults; src/store/fault.rs
//! finds them in an error or on the filesystems): telling one once through every channel that
//! still works — the log (`reason=`, `remedy=` fields), systemd's STATUS, the Machine's
//! `NodeUpdated` condition and a Warning Event — and, for a fault that can pass by itself,
//! holding new work until it has passed, then saying so on the same channels.
//!
//! Holding is what keeps a full disk or a read-only mount from costing an operation: a step
//! whose intent cannot be written never runs (the executor writes the intent first), a claim
//! that cannot be recorded is not made (the operation stays `Pending`, told why), and what a
//! crash-like failure left half-done is finished from its intent once the store takes writes
//! again, as after a crash.

use super::notify;
use crate::effects::kube::KubePublisher;
use crate::lifecycle::NodeState;
use crate::lifecycle::fault::{Fault, FaultKind};
use crate::store::fault::{probe_dir, read_only};
use std::path::{Path, PathBuf};

/// `fault` through every channel: the log, STATUS, and (with a publisher) the Machine's
/// condition and a Warning Event. A failed Machine write is logged: the other channels stand.
pub async fn tell(fault: &Fault, publisher: Option<&KubePublisher>) {
    let kind = fault.kind;
    tracing::error!(
        reason = %kind,
        path = %fault.path.display(),
        detail = %fault.detail,
        remedy = %fault.remedy(),
        waits = !kind.needs_operator(),
        "{}",
        fault.message()
    );
    notify::status_text(&format!("{fault}; {}", fault.remedy()));
    if let Some(p) = publisher
        && let Err(e) = p.report_fault(fault).await
    {
        tracing::warn!(reason = %kind, error = %e, "the Machine does not show the fault");
    }
}

/// The daemon's account of a fault it waits out. At most one at a time: the first found.
#[derive(Debug)]
pub struct Health {
    current: Option<Fault>,
    /// The host's `/etc` as this process reaches it; `None`: not looked at (a simulated host).
    etc: Option<PathBuf>,
}

impl Health {
    pub fn new(etc: Option<PathBuf>) -> Self {
        Self { current: None, etc }
    }

    pub fn fault(&self) -> Option<&Fault> {
        self.current.as_ref()
    }

    /// A fault the daemon waits out; told when it is new.
    pub async fn enter(&mut self, fault: Fault, publisher: &KubePublisher) {
        if self.current.as_ref().map(|f| f.kind) == Some(fault.kind) {
            return;
        }
        tell(&fault, Some(publisher)).await;
        self.current = Some(fault);
    }

    /// A fault an earlier process reported (a damaged store since restored, a configuration
    /// since fixed) is over once a daemon runs: the Machine that still shows one gets the
    /// phase the core reports for `state` back. One read of the Machine per start.
    pub async fn clear_shown(&self, state: &NodeState, publisher: &KubePublisher) {
        let Some(phase) = state.machine_phase() else {
            return;
        };
        let generation = state.node().map(|n| n.applied.generation);
        match publisher
            .clear_fault(phase, "the agent runs again", generation)
            .await
        {
            Ok(true) => tracing::info!("the Machine's fault from an earlier start is cleared"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "the Machine may still show an earlier fault"),
        }
    }

    /// Whether new work may start: after a store fault, the filesystem of `store` is
    /// writable with at least [`LOW_SPACE`](crate::store::fault::LOW_SPACE) free and the
    /// store takes a write again (`writable`); `/etc` is writable. A fault that has passed is
    /// said to be over (log, STATUS, the Machine back at the phase the core reports for
    /// `state`).
    pub async fn check(
        &mut self,
        store: &Path,
        writable: impl FnOnce() -> bool,
        state: &NodeState,
        publisher: &KubePublisher,
    ) -> bool {
        let store_fault = self
            .current
            .as_ref()
            .is_some_and(|f| f.kind != FaultKind::EtcReadOnly);
        // Room first: after a write the disk refused, a small one may still fit where the
        // refused one had reached, so a write alone does not say the disk has room again.
        if store_fault
            && (probe_dir(store.parent().unwrap_or(Path::new("/"))).is_some() || !writable())
        {
            return false;
        }
        if let Some(etc) = &self.etc
            && read_only(etc)
        {
            let fault = Fault::new(FaultKind::EtcReadOnly, etc, "");
            if store_fault {
                self.current = None;
            }
            self.enter(fault, publisher).await;
            return false;
        }
        if let Some(over) = self.current.take() {
            let message = format!("{} is over: the agent runs again", over.kind);
            tracing::info!(reason = %over.kind, "{message}");
            notify::status_text(&format!("{}; {message}", state.phase_name()));
            if let Some(phase) = state.machine_phase()
                && let Err(e) = publisher
                    .clear_fault(phase, &message, state.node().map(|n| n.applied.generation))
                    .await
            {
                tracing::warn!(error = %e, "the Machine still shows {}", over.kind);
            }
        }
        true
    }
}
