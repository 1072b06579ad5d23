//! The executor: the single owner of the state machine. It persists each step's intent,
//! runs the effects, records the outcome, and reports the outcome back to the core.

mod apply;
mod node;

pub use apply::{start_agent, write_units};
pub use node::NODE_READY_TIMEOUT;

use crate::config::NodeImage;
use crate::effects::{Containerd, EffectError, Effects, Host, Publisher, Systemd};
use crate::machine::agent::{AgentBuild, Sha256Hex};
use crate::machine::policy::Policy;
use crate::machine::{Input, NodeState, Refusal, Timestamp, step};
use crate::store::{Intent, Store, StoreError};
use std::collections::BTreeMap;

/// Wall-clock time, injected so simulations control it.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Timestamp::from_millis(ms)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Simulation: the process died in the middle of an effect.
    #[error("the process died (simulated crash)")]
    Crashed,
}

/// What became of an input.
#[derive(Clone, Debug, PartialEq)]
pub enum Fed {
    Accepted(Box<NodeState>),
    Refused(Refusal),
}

#[derive(Debug)]
pub struct Runner<S, C, H, P, K> {
    pub store: Store,
    pub effects: Effects<S, C, H, P>,
    pub policy: Policy,
    pub clock: K,
    /// This process asked systemd to restart the agent: it is the old daemon now, and the
    /// judgement of a hand-off belongs to its successor.
    restart_requested: bool,
    /// True for the agent daemon; false for CLI processes (join, reset, the recovery unit).
    pub daemon: bool,
    /// The node image per Kubernetes version (the configuration's `nodeImages`); empty:
    /// machines without a kubelet.
    pub node_images: BTreeMap<String, NodeImage>,
    /// Told that the executor makes progress: after each effect and while a long one waits
    /// (`AwaitNode`). The daemon feeds systemd's watchdog with it, so one step of several
    /// long effects (a repave) is not taken for a hung daemon.
    pub on_progress: Option<Progress>,
}

/// A progress callback ([`Runner::on_progress`]).
pub struct Progress(pub Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress")
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
    pub fn new(store: Store, effects: Effects<S, C, H, P>, clock: K) -> Self {
        Self {
            store,
            effects,
            policy: Policy::default(),
            clock,
            restart_requested: false,
            daemon: true,
            node_images: BTreeMap::new(),
            on_progress: None,
        }
    }

    fn alive(&self) {
        if let Some(Progress(f)) = &self.on_progress {
            f();
        }
    }

    pub fn state(&self) -> Result<NodeState, ExecError> {
        Ok(self.store.load()?.state)
    }

    /// Feeds one input and follows it through every step whose effects it must report.
    pub async fn feed(&mut self, input: Input) -> Result<Fed, ExecError> {
        let mut input = input;
        let mut reporting = false;
        loop {
            let persisted = self.store.load()?;
            if let Some(intent) = persisted.pending {
                // An earlier step's effects never finished (crash): finish them first.
                self.resume_intent(&intent, &persisted.state).await?;
                continue;
            }
            let from = persisted.state;
            let now = self.clock.now();
            let next = match step(&from, &input, &self.policy, now) {
                Ok(next) => next,
                // An outcome nobody waits for: the input that caused it was accepted.
                Err(_) if reporting => return Ok(Fed::Accepted(Box::new(from))),
                Err(refusal) => return Ok(Fed::Refused(refusal)),
            };
            // Nothing happens: nothing to record (timers and re-observations are frequent).
            if next.effects.is_empty() && next.next == from {
                return Ok(Fed::Accepted(Box::new(from)));
            }
            if let Input::OperationClaimed(claim) = &input {
                self.store.record_claim(
                    &claim.op,
                    claim.kind.name(),
                    claim.machine_generation,
                    now,
                )?;
            }
            let seq = self
                .store
                .begin_step(&from, &input, &next.next, &next.effects, now)?;
            // A hand-off that ended here (e.g. its deadline rolled it back) makes this process
            // the agent again.
            if !next.next.awaits_successor() {
                self.restart_requested = false;
            }
            tracing::info!(from = %from, input = %input, to = %next.next, "transition");
            if next.effects.is_empty() {
                return Ok(Fed::Accepted(Box::new(next.next)));
            }
            let outcome = self.run_effects(&next.effects, None).await;
            let Some(report) = self.record_outcome(seq, outcome, "")? else {
                return Err(ExecError::Crashed);
            };
            // A failure always goes back to the core (a hand-off whose restart could not be
            // scheduled must roll back); success only where the state waits for it.
            if !next.next.awaits_effects() && report == Input::EffectsDone {
                return Ok(Fed::Accepted(Box::new(next.next)));
            }
            input = report;
            reporting = true;
        }
    }

    /// Daemon start-up: finish an interrupted step, publish what waits, then tell the core
    /// which build runs (the successor's judgement of a hand-off happens here); then, on a
    /// node at rest, this build's units and image hygiene.
    pub async fn start(&mut self, running: AgentBuild) -> Result<Fed, ExecError> {
        self.resume().await?;
        self.flush_outbox().await?;
        if self.restart_requested {
            tracing::info!(
                "a restart of the agent is scheduled; leaving the hand-off to the successor"
            );
            return Ok(Fed::Accepted(Box::new(self.state()?)));
        }
        let fed = self.feed(Input::DaemonStarted { running }).await?;
        self.converge_units().await?;
        self.prune_agent_images().await?;
        Ok(fed)
    }

    /// The agent's units as this build ships them, at every daemon start once a hand-off is
    /// judged (so a broken successor never rewrites the recovery unit): only on a node at
    /// rest — during an operation the build that finishes it writes its own — and not while
    /// a restart is pending. A failed write leaves the previous units and is logged.
    pub async fn converge_units(&mut self) -> Result<(), ExecError> {
        if self.restart_requested {
            return Ok(());
        }
        let NodeState::Ready { node } = self.state()? else {
            return Ok(());
        };
        match write_units(&self.effects.systemd, node.mode).await {
            Ok(true) => tracing::info!(
                mode = node.mode.as_str(),
                "units rewritten; systemd reloaded"
            ),
            Ok(false) => {}
            Err(EffectError::Crashed) => return Err(ExecError::Crashed),
            Err(EffectError::Failed(message)) => {
                tracing::warn!(%message, "the agent's units were not rewritten")
            }
        }
        Ok(())
    }

    /// Image hygiene at every daemon start, on a node at rest: the images upgrades pulled
    /// that nothing will run again (neither the running build nor its last-good) are removed
    /// from containerd, then forgotten. Images the agent did not pull are never touched. A
    /// failure is logged; the next start tries again.
    pub async fn prune_agent_images(&mut self) -> Result<(), ExecError> {
        if self.restart_requested {
            return Ok(());
        }
        let NodeState::Ready { node } = self.state()? else {
            return Ok(());
        };
        let kept = |d: &Sha256Hex| {
            [Some(&node.agent), node.last_good.as_ref()]
                .into_iter()
                .flatten()
                .any(|b| matches!(b, AgentBuild::Image { digest } if digest == d))
        };
        for stored in self.store.agent_images()? {
            let Some(digest) = Sha256Hex::parse(&stored) else {
                continue;
            };
            if kept(&digest) {
                continue;
            }
            match self.effects.containerd.remove_agent_image(&digest).await {
                Ok(()) => {
                    self.store.forget_agent_image(&stored)?;
                    tracing::info!(image = %digest.oci(), "removed an agent image nothing will run again");
                }
                Err(EffectError::Crashed) => return Err(ExecError::Crashed),
                Err(EffectError::Failed(message)) => {
                    tracing::warn!(image = %digest.oci(), %message, "agent image not removed")
                }
            }
        }
        Ok(())
    }

    /// `flexnode reset` of a node whose store was damaged or lost and has been set aside:
    /// the reset's own effects (both machines, runtime files, units, links; each probed
    /// first), with no state to step from. Nothing else runs effects outside a step.
    pub async fn reset_without_state(&mut self) -> Result<(), EffectError> {
        use crate::machine::Effect;
        self.run_effects(&[Effect::WipeNode, Effect::UninstallAgent], None)
            .await
    }

    /// Whether this process scheduled or requested its own restart.
    pub fn restart_requested(&self) -> bool {
        self.restart_requested
    }

    /// Finishes the effects of a step interrupted by a crash, probing each first.
    pub async fn resume(&mut self) -> Result<(), ExecError> {
        let persisted = self.store.load()?;
        if let Some(intent) = persisted.pending {
            self.resume_intent(&intent, &persisted.state).await?;
        }
        Ok(())
    }

    async fn resume_intent(&mut self, intent: &Intent, state: &NodeState) -> Result<(), ExecError> {
        tracing::warn!(seq = intent.seq, state = %state, "resuming effects interrupted by a crash");
        let outcome = self.run_effects(&intent.effects, Some(intent.at)).await;
        let Some(report) = self.record_outcome(intent.seq, outcome, " (resumed)")? else {
            return Err(ExecError::Crashed);
        };
        if (state.awaits_effects() || report != Input::EffectsDone)
            && let Fed::Refused(r) = Box::pin(self.feed(report)).await?
        {
            tracing::debug!(refusal = %r, "outcome of a resumed step not needed");
        }
        Ok(())
    }

    /// Records a step's outcome; `None` when the process "died" (simulation).
    fn record_outcome(
        &mut self,
        seq: i64,
        outcome: Result<(), EffectError>,
        suffix: &str,
    ) -> Result<Option<Input>, ExecError> {
        let now = self.clock.now();
        match outcome {
            Ok(()) => {
                self.store.finish_step(seq, &format!("ok{suffix}"), now)?;
                Ok(Some(Input::EffectsDone))
            }
            Err(EffectError::Failed(message)) => {
                tracing::warn!(seq, %message, "effect failed");
                self.store
                    .finish_step(seq, &format!("failed{suffix}: {message}"), now)?;
                Ok(Some(Input::EffectsFailed { message }))
            }
            Err(EffectError::Crashed) => Ok(None),
        }
    }

    /// Runs a step's effects in order. `resumed`: the time of the intent of a step that an
    /// earlier process did not finish.
    async fn run_effects(
        &mut self,
        effects: &[crate::machine::Effect],
        resumed: Option<Timestamp>,
    ) -> Result<(), EffectError> {
        for effect in effects {
            self.apply(effect, resumed).await?;
            self.alive();
        }
        Ok(())
    }

    /// Publishes results that wait in the store; returns how many still wait.
    pub async fn flush_outbox(&self) -> Result<usize, ExecError> {
        let waiting = self.store.unpublished()?;
        let mut left = 0;
        for r in waiting {
            match self
                .effects
                .publisher
                .publish_result(&r.op, &r.result, r.completed_at)
                .await
            {
                Ok(()) => self.store.mark_published(&r.op.uid, self.clock.now())?,
                Err(EffectError::Crashed) => return Err(ExecError::Crashed),
                Err(EffectError::Failed(message)) => {
                    tracing::warn!(op = %r.op, %message, "result not published yet");
                    left += 1;
                }
            }
        }
        Ok(left)
    }
}
