//! `Drain` and `Uncordon`: the cordon recorded before it is placed, evictions retried with
//! back-off until the node is empty or the drain's time is up, progress told as it changes.

use super::{Clock, ExecError, Runner, apply::store_failed};
use crate::effects::{Containerd, EffectError, EffectResult, Eviction, Host, Publisher, Systemd};
use crate::lifecycle::drain::{DrainPolicy, OnTimeout, PodFacts, PodPlan, plan};
use crate::lifecycle::result::MachinePhase;
use crate::lifecycle::state::{NodeState, OpRun};
use crate::lifecycle::{Timestamp, drain};
use std::time::Duration;

/// How many pods a progress line names.
const NAMED: usize = 3;
/// How long an emptied node waits for the evicted pods' budgets to be whole again.
const RECOVERY_GRACE_MS: i64 = 60_000;

/// One look at the node's pods.
#[derive(Default)]
struct Pass {
    /// Pods the drain still waits for (`namespace/name`), with the budgets holding each.
    left: Vec<(String, Vec<String>)>,
    /// Pods the policy does not let it evict, with why.
    refused: Vec<String>,
    /// Once no pod is left: the budgets of the evicted pods that do not count all their pods
    /// healthy again (their replicas not yet Ready elsewhere).
    recovering: Vec<String>,
}

impl Pass {
    fn summary(&self) -> String {
        let mut text = match self.left.len() {
            0 => "no pod left".to_string(),
            1 => "1 pod left".to_string(),
            n => format!("{n} pods left"),
        };
        let held: Vec<String> = self
            .left
            .iter()
            .filter(|(_, budgets)| !budgets.is_empty())
            .take(NAMED)
            .map(|(pod, budgets)| format!("{pod} held by budget {}", budgets.join(", ")))
            .collect();
        let waiting: Vec<&str> = self
            .left
            .iter()
            .filter(|(_, budgets)| budgets.is_empty())
            .take(NAMED)
            .map(|(pod, _)| pod.as_str())
            .collect();
        if !held.is_empty() {
            text.push_str(&format!(": {}", held.join("; ")));
        } else if !waiting.is_empty() {
            text.push_str(&format!(": {}", waiting.join(", ")));
        }
        if !self.refused.is_empty() {
            text.push_str(&format!("; not evicted: {}", self.refused.join("; ")));
        }
        if !self.recovering.is_empty() {
            text.push_str(&format!(
                "; waiting for the evicted pods' budgets to be whole again: {}",
                self.recovering.join(", ")
            ));
        }
        text
    }

    /// No pod left to wait for (those the policy keeps stay where `Proceed` says so).
    fn emptied(&self, policy: &DrainPolicy) -> bool {
        self.left.is_empty() && (self.refused.is_empty() || policy.on_timeout == OnTimeout::Proceed)
    }
}

impl<S, C, H, P, K> Runner<S, C, H, P, K>
where
    S: Systemd,
    C: Containerd,
    H: Host,
    P: Publisher,
    K: Clock,
{
    pub(super) async fn drain(
        &self,
        run: Option<&OpRun>,
        holder: &str,
        policy: &DrainPolicy,
        until: Timestamp,
    ) -> EffectResult {
        // A drain resumed after a crash keeps its record, and counts from its first start.
        let began = self
            .store
            .begin_drain(holder, self.clock.now())
            .map_err(store_failed)?
            .since;
        let mut delays = backon::BackoffBuilder::build(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_secs(1))
                .with_max_delay(Duration::from_secs(10))
                .without_max_times(),
        );
        let mut cordoned = false;
        let mut evicted = Vec::new();
        let mut emptied = None;
        let mut told = String::new();
        loop {
            // A request lost on its way is sent again by the publisher, a 503 by kube's
            // client: what reaches here (a refusal, an outage) fails the drain at once, with
            // nothing disrupted, rather than at its timeout.
            let pass = self
                .drain_pass(holder, policy, &mut cordoned, &mut evicted)
                .await
                .map_err(|e| match e {
                    EffectError::Failed(message) => {
                        EffectError::Failed(format!("drain failed: {message}"))
                    }
                    crashed @ EffectError::Crashed => crashed,
                })?;
            let summary = pass.summary();
            let now = self.clock.now();
            if pass.emptied(policy) {
                // The node holds none of the evicted pods any more: their budgets are waited
                // for a while (their replacements Ready elsewhere before the disruption), not
                // for the drain's whole time (a replica Pending for want of room, or one
                // crash-looping elsewhere, would hold the operation up for nothing).
                let since = *emptied.get_or_insert(now);
                let waited = now.millis() - since.millis();
                if pass.recovering.is_empty() || waited >= RECOVERY_GRACE_MS || now >= until {
                    let secs = (now.millis() - began.millis()) / 1000;
                    let going_on = if pass.recovering.is_empty() {
                        ""
                    } else {
                        "; going on: the node holds none of their pods"
                    };
                    let line = format!("drained in {secs}s ({summary}{going_on})");
                    self.tell(run, holder, &line).await;
                    return Ok(());
                }
            }
            if !pass.refused.is_empty() && policy.on_timeout == OnTimeout::Fail {
                return Err(EffectError::Failed(format!(
                    "drain refused: {}",
                    pass.refused.join("; ")
                )));
            }
            if summary != told {
                self.tell(run, holder, &format!("draining: {summary}"))
                    .await;
                told = summary.clone();
            }
            if now >= until {
                let after = humantime(policy.timeout_secs);
                match policy.on_timeout {
                    OnTimeout::Fail => {
                        return Err(EffectError::Failed(format!(
                            "drain timed out after {after}: {summary}"
                        )));
                    }
                    OnTimeout::Proceed => {
                        let line = format!("drain timed out after {after}; going on: {summary}");
                        tracing::warn!("{line}");
                        self.tell(run, holder, &line).await;
                        return Ok(());
                    }
                }
            }
            self.alive();
            // Never past the drain's time.
            let left =
                Duration::from_millis(u64::try_from(until.millis() - now.millis()).unwrap_or(0));
            let pause = delays.next().unwrap_or(Duration::from_secs(10)).min(left);
            tokio::time::sleep(pause).await;
        }
    }

    /// The cordon (once), then every pod's plan and the evictions it asks for; once no pod
    /// is left, whether the evicted pods' budgets are whole again.
    async fn drain_pass(
        &self,
        holder: &str,
        policy: &DrainPolicy,
        cordoned: &mut bool,
        evicted: &mut Vec<PodFacts>,
    ) -> EffectResult<Pass> {
        let fx = &self.effects;
        if !*cordoned {
            if fx.publisher.cordon(holder).await? {
                self.store.mark_cordoned(holder).map_err(store_failed)?;
                tracing::info!(%holder, "the Node is cordoned for the drain");
            }
            *cordoned = true;
        }
        let mut pass = Pass::default();
        let mut to_evict = Vec::new();
        for pod in fx.publisher.pods_on_node().await? {
            match plan(&pod, policy) {
                PodPlan::Keep => {}
                PodPlan::Wait => pass.left.push((pod.name, Vec::new())),
                PodPlan::Refuse(why) => pass.refused.push(format!("{}: {why}", pod.name)),
                PodPlan::Evict => to_evict.push(pod),
            }
        }
        // A pod the policy keeps fails the drain before anything is evicted.
        if !pass.refused.is_empty() && policy.on_timeout == OnTimeout::Fail {
            return Ok(pass);
        }
        for pod in to_evict {
            match fx.publisher.evict(&pod).await? {
                Eviction::Gone => {}
                Eviction::Evicted => {
                    tracing::info!(pod = %pod.name, "evicted");
                    pass.left.push((pod.name.clone(), Vec::new()));
                    evicted.push(pod);
                }
                Eviction::Blocked { budgets } => pass.left.push((pod.name, budgets)),
            }
            // An eviction a budget holds can take its whole wait (src/effects/kube/drain.rs).
            self.alive();
        }
        if pass.left.is_empty() && !evicted.is_empty() {
            pass.recovering = fx.publisher.budgets_recovering(evicted).await?;
        }
        Ok(pass)
    }

    /// Progress to the operation (or, for a repave, the Machine), the store and the log; a
    /// write that fails is only logged (the next one may land).
    async fn tell(&self, run: Option<&OpRun>, holder: &str, line: &str) {
        tracing::info!(%holder, "{line}");
        if let Err(e) = self.store.record_drain_progress(line) {
            tracing::warn!(error = %e, "drain progress not recorded");
        }
        let publisher = &self.effects.publisher;
        let told = match run {
            Some(run) => {
                publisher
                    .report_progress(&run.op, line, run.machine_generation, run.started_at)
                    .await
            }
            None if drain::is_repave(holder) => {
                publisher
                    .report_machine(MachinePhase::Provisioning, line, None)
                    .await
            }
            None => Ok(()),
        };
        if let Err(e) = told {
            tracing::warn!(error = %e, "drain progress not reported");
        }
    }

    /// `Uncordon`: the recorded holder's cordon lifted, if the Node still carries its mark
    /// (not `cordoned`: a crash may have come between the cordon and its record). An API
    /// server away keeps the record; the node at rest lifts it later
    /// ([`Runner::release_cordon`]), so the step's result is not held up.
    pub(super) async fn uncordon(&self) -> EffectResult {
        let Some(record) = self.store.cordon().map_err(store_failed)? else {
            return Ok(());
        };
        match self.effects.publisher.uncordon(&record.holder).await {
            Ok(lifted) => {
                if lifted {
                    tracing::info!(holder = %record.holder, "Node uncordoned");
                }
                self.store.forget_cordon().map_err(store_failed)
            }
            Err(EffectError::Crashed) => Err(EffectError::Crashed),
            Err(EffectError::Failed(message)) => {
                tracing::warn!(%message, "the cordon is kept for now; lifted when the API server answers");
                Ok(())
            }
        }
    }

    /// A cordon whose drain's step has ended, left by an API server that was away: lifted
    /// now, on a node at rest.
    pub(super) async fn release_cordon(&self) -> Result<(), ExecError> {
        let persisted = self.store.load()?;
        let at_rest = persisted.pending.is_none()
            && matches!(
                persisted.state,
                NodeState::Ready { .. } | NodeState::Unjoined { .. }
            );
        if !at_rest || self.store.cordon()?.is_none() {
            return Ok(());
        }
        match self.uncordon().await {
            Err(EffectError::Crashed) => Err(ExecError::Crashed),
            Ok(()) | Err(EffectError::Failed(_)) => Ok(()),
        }
    }
}

/// `600` → `10m0s`, as Go prints a duration.
fn humantime(secs: i64) -> String {
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}
