//! The executor: the single owner of the state machine. It persists each step's intent,
//! runs the effects, records the outcome, and reports the outcome back to the core.

mod apply;

pub use apply::{start_agent, write_units};

use crate::effects::{Containerd, EffectError, Effects, Host, Publisher, Systemd};
use crate::machine::agent::AgentBuild;
use crate::machine::policy::Policy;
use crate::machine::{Input, NodeState, Refusal, Timestamp, step};
use crate::store::{Intent, Store, StoreError};

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
    /// which build runs (the successor's judgement of a hand-off happens here).
    pub async fn start(&mut self, running: AgentBuild) -> Result<Fed, ExecError> {
        self.resume().await?;
        self.flush_outbox().await?;
        if self.restart_requested {
            tracing::info!(
                "a restart of the agent is scheduled; leaving the hand-off to the successor"
            );
            return Ok(Fed::Accepted(Box::new(self.state()?)));
        }
        self.feed(Input::DaemonStarted { running }).await
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
