//! Which of this node's operations the owner claims, and what it tells those that wait.

use super::Owner;
use crate::api::MachineOperation;
use crate::effects::{Containerd, Host, Systemd};
use crate::exec::{ExecError, Fed};
use crate::lifecycle::Input;
use crate::reconcile::address;
use std::collections::BTreeMap;

impl<S: Systemd, C: Containerd, H: Host> Owner<S, C, H> {
    /// This node's operations that wait to be claimed.
    pub(super) fn waiting<'a>(
        &'a self,
        labels: Option<&'a BTreeMap<String, String>>,
    ) -> impl Iterator<Item = &'a MachineOperation> {
        self.ops.values().filter(move |op| {
            address::is_claimable(op) && address::addressed(op, &self.node_name, labels)
        })
    }

    /// Claims this node's waiting operations, oldest first; a busy node keeps them waiting.
    /// Not before the Machine's watch has reported once (an absent Machine counts): every
    /// claim carries its generation (`observedMachineGeneration`), which a claim made earlier
    /// would report as none.
    ///
    /// While a watch is interrupted (the API server away) nothing is claimed: a claim's first
    /// effect writes `InProgress`, and an outage would fail the operation instead of leaving
    /// it for later. Nor until each interrupted operation watch's next list has been handled
    /// (`stale`, in message order): before it, an operation deleted meanwhile (an etcd that
    /// lost its data) may still look like one waiting.
    pub(super) async fn claim_waiting(&mut self) -> Result<(), ExecError> {
        if self.machine.is_none() || !self.counters.connected() || !self.stale.is_empty() {
            return Ok(());
        }
        let labels = self.labels();
        let mut waiting: Vec<MachineOperation> = self.waiting(labels.as_ref()).cloned().collect();
        waiting.sort_by(|a, b| {
            (
                a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &a.metadata.name,
            )
                .cmp(&(
                    b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    &b.metadata.name,
                ))
        });
        if waiting.is_empty() {
            return Ok(());
        }
        // In a bad environment nothing new starts: each operation is told why it waits.
        if !self.check_health().await {
            for op in &waiting {
                self.tell_unhealthy(op).await;
            }
            return Ok(());
        }
        for op in waiting {
            let Some(claim) = address::claim(&op, self.machine_generation()) else {
                continue; // meant for another controller
            };
            // A result already recorded is re-published from the outbox, never re-run.
            if self.runner.has_result(&claim.op.uid)? {
                continue;
            }
            // Its status writes start from the object as watched (kube.rs: `known`).
            let uid = claim.op.uid.clone();
            self.runner.publisher().remember(&op);
            let fed = self.feed(Input::OperationClaimed(claim)).await;
            if !matches!(fed, Ok(Fed::Accepted(_))) {
                self.runner.publisher().forget(&uid);
            }
            // A claim the store could not record was not made: the operation waits.
            let fed = match fed {
                Err(e) => {
                    self.wait_out(e).await?;
                    self.tell_unhealthy(&op).await;
                    return Ok(());
                }
                Ok(fed) => fed,
            };
            match fed {
                Fed::Accepted(_) => {}
                Fed::Refused(r) if r.is_transient() => {
                    if let Some(uid) = op.metadata.uid.clone()
                        && self.told_waiting.insert(uid)
                    {
                        let why = format!("waiting: {r}");
                        self.runner.publisher().waiting(&op, &why).await;
                    }
                    break;
                }
                Fed::Refused(r) => tracing::debug!(refusal = %r, "operation not claimed"),
            }
        }
        Ok(())
    }

    /// A claimable operation is marked `Pending` and told, once, the fault it waits for.
    pub(super) async fn tell_unhealthy(&mut self, op: &MachineOperation) {
        let Some(fault) = self.health.fault() else {
            return;
        };
        if address::claim(op, 0).is_none() {
            return;
        }
        if let Some(uid) = op.metadata.uid.clone()
            && self.told_waiting.insert(uid)
        {
            let why = format!("waiting: {fault}; {}", fault.remedy());
            self.runner.publisher().waiting(op, &why).await;
        }
    }

    /// After a (re-)list, what this node has to do: the journal line operators (and the e2e
    /// suite) read to know the daemon has seen every operation and decided about each.
    pub(super) fn log_listed(&self, watch: &str) {
        let labels = self.labels();
        let mine: Vec<&MachineOperation> = self
            .ops
            .values()
            .filter(|op| address::addressed(op, &self.node_name, labels.as_ref()))
            .collect();
        let finished = mine.iter().filter(|op| op.is_terminal()).count();
        let waiting = mine.iter().filter(|op| address::is_claimable(op)).count();
        tracing::info!(
            node = %self.node_name,
            watch = %watch,
            addressed = mine.len(),
            finished,
            waiting,
            state = %self.runner.state().map(|s| s.to_string()).unwrap_or_default(),
            "operations listed"
        );
    }
}
