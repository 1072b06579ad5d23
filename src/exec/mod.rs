//! The executor: the single owner of the state machine. It persists each step's intent,
//! runs the effects, records the outcome, and reports the outcome back to the core.

mod apply;
mod drain;
mod node;

pub use apply::{start_agent, write_units};
pub use node::NODE_READY_TIMEOUT;

use crate::config::NodeImages;
use crate::effects::{Containerd, EffectError, Effects, Host, Publisher, Systemd};
use crate::lifecycle::agent::{AgentBuild, Sha256Hex};
use crate::lifecycle::policy::Policy;
use crate::lifecycle::{Input, NodeState, Refusal, Timestamp, step, table};
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

impl ExecError {
    /// The bad environment behind this error (src/store/fault.rs), if it is one; `store` is
    /// the store file.
    pub fn fault(&self, store: &std::path::Path) -> Option<crate::lifecycle::fault::Fault> {
        match self {
            Self::Store(e) => crate::store::fault::of_store(e, store),
            Self::Crashed => None,
        }
    }
}

/// What became of an input.
#[derive(Clone, Debug, PartialEq)]
pub enum Fed {
    Accepted(Box<NodeState>),
    Refused(Refusal),
}

#[derive(Debug)]
pub struct Runner<S, C, H, P, K> {
    store: Store,
    effects: Effects<S, C, H, P>,
    policy: Policy,
    clock: K,
    /// This process asked systemd to restart the agent: it is the old daemon now, and the
    /// judgement of a hand-off belongs to its successor.
    restart_requested: bool,
    /// True for the agent daemon; false for CLI processes (join, reset, the recovery unit).
    daemon: bool,
    /// The node images (the configuration's `nodeImages` and `nodeImage`); none: machines
    /// without a kubelet.
    node_images: NodeImages,
    /// Told that the executor makes progress: after each effect and while a long one waits
    /// (`AwaitNode`). The daemon feeds systemd's watchdog with it, so one step of several
    /// long effects (a repave) is not taken for a hung daemon.
    on_progress: Option<Progress>,
}

/// A progress callback ([`Runner::set_on_progress`]).
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
            node_images: NodeImages::default(),
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

    /// A CLI process (join, reset, the recovery unit), not the agent daemon.
    pub fn set_daemon(&mut self, daemon: bool) {
        self.daemon = daemon;
    }

    pub fn is_daemon(&self) -> bool {
        self.daemon
    }

    pub fn set_node_images(&mut self, images: NodeImages) {
        self.node_images = images;
    }

    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    pub fn set_clock(&mut self, clock: K) {
        self.clock = clock;
    }

    pub fn clock(&self) -> &K {
        &self.clock
    }

    pub fn set_on_progress(&mut self, progress: Progress) {
        self.on_progress = Some(progress);
    }

    pub fn publisher(&self) -> &P {
        &self.effects.publisher
    }

    /// The store itself, for the simulation and the tests that read it in place.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store's file: the daemon's other files (its status socket) live beside it.
    pub fn store_path(&self) -> &std::path::Path {
        self.store.path()
    }

    /// Whether a result waits in the outbox to be published.
    pub fn has_unpublished(&self) -> Result<bool, ExecError> {
        Ok(!self.store.unpublished()?.is_empty())
    }

    /// Whether the operation `uid` has a result recorded (it ran here already).
    pub fn has_result(&self, uid: &str) -> Result<bool, ExecError> {
        Ok(self.store.result_for(uid)?.is_some())
    }

    /// The store takes a write (after a fault of its filesystem).
    pub fn store_writable(&self) -> bool {
        self.store.check_writable().is_ok()
    }

    /// Folds the WAL into the store file (at a daemon's stop).
    pub fn checkpoint(&self) -> Result<(), ExecError> {
        Ok(self.store.checkpoint()?)
    }

    /// Feeds one input and follows it through every step whose outcome the core waits for.
    /// What an earlier process left comes first: an interrupted step is finished (unless
    /// `input` preempts it, [`crate::lifecycle::preempts`]), and an outcome it recorded but did
    /// not report is fed.
    pub async fn feed(&mut self, input: Input) -> Result<Fed, ExecError> {
        self.drive(Some(input)).await
    }

    async fn drive(&mut self, mut input: Option<Input>) -> Result<Fed, ExecError> {
        loop {
            let persisted = self.store.load()?;
            let now = self.clock.now();
            let mut superseded = None;
            if let Some(intent) = &persisted.pending {
                // Without an input of its own (a process starting), a deadline that passed
                // while no process ran may preempt.
                let first = input.clone().unwrap_or(Input::Tick);
                if !crate::lifecycle::preempts(&persisted.state, &first, &self.policy, now) {
                    self.resume_intent(intent, &persisted.state).await?;
                    continue;
                }
                tracing::warn!(seq = intent.seq, state = %persisted.state, input = %first,
                    "an interrupted step is superseded");
                superseded = Some(intent.seq);
                input = Some(first);
            }
            let from = persisted.state;
            let (next_input, is_report) = match (persisted.report, input.take()) {
                (Some(report), caller) => {
                    input = caller;
                    (report, true)
                }
                (None, Some(caller)) => (caller, false),
                (None, None) => return Ok(Fed::Accepted(Box::new(from))),
            };
            let next = match step(&from, &next_input, &self.policy, now) {
                Ok(next) => next,
                Err(refusal) if is_report => {
                    tracing::debug!(%refusal, "an outcome nobody waits for");
                    self.store.clear_report()?;
                    continue;
                }
                Err(refusal) => return Ok(Fed::Refused(refusal)),
            };
            // Nothing happens: nothing to record (timers and re-observations are frequent).
            if next.effects.is_empty() && next.next == from {
                if is_report {
                    self.store.clear_report()?;
                }
                continue;
            }
            let began = std::time::Instant::now();
            let seq = self.store.begin_step_superseding(
                &from,
                &next_input,
                &next.next,
                &next.effects,
                now,
                superseded,
            )?;
            // A hand-off that ended here (e.g. its deadline rolled it back) makes this process
            // the agent again.
            if !next.next.awaits_successor() {
                self.restart_requested = false;
            }
            // The operation the step belongs to: the one it starts or runs, else the one it
            // ends, else the one it was fed (a claim refused at once).
            let claimed = match &next_input {
                Input::OperationClaimed(claim) => Some((&claim.op, claim.kind.name())),
                _ => None,
            };
            let op = next.next.operation().or(from.operation()).or(claimed);
            let (from_label, to_label) = (table::label(&from), table::label(&next.next));
            tracing::info!(
                from = %from,
                input = %next_input,
                to = %next.next,
                operation = op.map(|(op, _)| display(&op.name)),
                operation_uid = op.map(|(op, _)| display(&op.uid)),
                kind = op.map(|(_, kind)| display(kind)),
                phase = %next.next.phase_name(),
                transition = %format_args!("{from_label} --{}--> {to_label}", next_input.name()),
                "transition"
            );
            if !next.effects.is_empty() {
                let outcome = self.run_effects(&next.effects, None).await;
                self.record_outcome(seq, &next.next, outcome, "")?;
            }
            crate::metrics::transition(
                &from_label,
                next_input.name(),
                &to_label,
                began.elapsed().as_secs_f64(),
            );
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
        let selected = self.selected_build().await?;
        let fed = self
            .feed(Input::DaemonStarted { running, selected })
            .await?;
        self.converge_units().await?;
        self.prune_agent_images().await?;
        Ok(fed)
    }

    /// The build the host selects to run (the `current` link, the image selection): what
    /// systemd starts next. Unknown on a node not joined, or if it cannot be read (logged).
    async fn selected_build(&self) -> Result<Option<AgentBuild>, ExecError> {
        let Some(node) = self.state()?.node().cloned() else {
            return Ok(None);
        };
        match self.effects.host.selected_agent(node.mode).await {
            Ok(selected) => Ok(selected),
            Err(EffectError::Crashed) => Err(ExecError::Crashed),
            Err(EffectError::Failed(message)) => {
                tracing::warn!(%message, "the selected agent build is unknown");
                Ok(None)
            }
        }
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
        use crate::lifecycle::Effect;
        self.run_effects(&[Effect::WipeNode, Effect::UninstallAgent], None)
            .await
    }

    /// Whether this process scheduled or requested its own restart.
    pub fn restart_requested(&self) -> bool {
        self.restart_requested
    }

    /// A copy of a process's memory (the simulation's fork of a running node).
    pub(crate) fn set_restart_requested(&mut self, requested: bool) {
        self.restart_requested = requested;
    }

    /// Finishes what an earlier process left: an interrupted step (or its deadline, if that
    /// passed meanwhile and preempts it) and an outcome it recorded but did not report.
    pub async fn resume(&mut self) -> Result<(), ExecError> {
        self.drive(None).await.map(drop)
    }

    /// Runs again the effects of a step a crash interrupted; each probes first.
    async fn resume_intent(&mut self, intent: &Intent, state: &NodeState) -> Result<(), ExecError> {
        tracing::warn!(seq = intent.seq, state = %state, "resuming effects interrupted by a crash");
        let outcome = self.run_effects(&intent.effects, Some(intent.at)).await;
        self.record_outcome(intent.seq, state, outcome, " (resumed)")
    }

    /// Records a step's outcome, with what the core must still be told in the same write: a
    /// failure always (a hand-off whose restart could not be scheduled must roll back),
    /// success where `state` waits for it. A crash (simulation) records nothing.
    fn record_outcome(
        &mut self,
        seq: i64,
        state: &NodeState,
        outcome: Result<(), EffectError>,
        suffix: &str,
    ) -> Result<(), ExecError> {
        let now = self.clock.now();
        let (text, report) = match outcome {
            Ok(()) => (format!("ok{suffix}"), Input::EffectsDone),
            Err(EffectError::Failed(message)) => {
                tracing::warn!(seq, %message, "effect failed");
                (
                    format!("failed{suffix}: {message}"),
                    Input::EffectsFailed { message },
                )
            }
            Err(EffectError::Crashed) => return Err(ExecError::Crashed),
        };
        let report = (state.awaits_effects() || report != Input::EffectsDone).then_some(report);
        self.store.finish_step(seq, &text, report.as_ref(), now)?;
        Ok(())
    }

    /// Runs a step's effects in order. `resumed`: the time of the intent of a step that an
    /// earlier process did not finish.
    async fn run_effects(
        &mut self,
        effects: &[crate::lifecycle::Effect],
        resumed: Option<Timestamp>,
    ) -> Result<(), EffectError> {
        for effect in effects {
            self.apply(effect, resumed).await?;
            self.alive();
        }
        Ok(())
    }

    /// Publishes results that wait in the store, and lifts a cordon whose drain's step has
    /// ended (`Uncordon` met an API server away); returns how many results still wait.
    pub async fn flush_outbox(&self) -> Result<usize, ExecError> {
        self.release_cordon().await?;
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
