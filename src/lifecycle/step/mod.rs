//! The transition function: one exhaustive match over state × input (here), with the work of
//! each family of transitions in its own file: join, claim, upgrade, repave, reset.

mod claim;
mod join;
mod reboot;
mod repave;
mod reset;
mod upgrade;

use super::agent::AgentBuild;
use super::decide::{GoalDecision, decide};
use super::drain::DrainPolicy;
use super::effect::Effect;
use super::input::{Claim, Input};
use super::policy::Policy;
use super::refusal::Refusal;
use super::result::{MachinePhase, OpResult, ResultReason};
use super::state::{
    FinishedOps, Goal, JoinPhase, NodeInfo, NodeState, OpRun, RepavePhase, ResetCause,
};
use super::time::Timestamp;
use claim::claim_operation;
use join::{join, join_failed};
use repave::repave_failure;
use reset::reset;
use upgrade::{UpgradeCtx, upgrade_step};
/// The next state and what must happen to get there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub next: NodeState,
    pub effects: Vec<Effect>,
}

impl Step {
    fn to(next: NodeState, effects: Vec<Effect>) -> Self {
        Self { next, effects }
    }

    fn stay(state: &NodeState) -> Self {
        Self {
            next: state.clone(),
            effects: Vec::new(),
        }
    }
}

pub const MSG_REBOOT_DONE: &str = "NodeReboot completed";
pub const MSG_RESET_DONE: &str = "AgentReset completed";
pub const MSG_UPGRADE_DONE: &str = "AgentUpgrade completed";
pub const MSG_ALREADY_RUNNING: &str = "AgentUpgrade completed; the agent already runs that image";
pub const MSG_RESTART_FAILED: &str = "failed to restart upgraded agent daemon";
pub const MSG_SUCCESSOR_MISSING: &str =
    "upgraded agent did not take over; the last-good agent is running";
pub const MSG_INTERRUPTED_BY_RESET: &str = "interrupted by a node reset";

/// Decides what `input` means in `state` at wall-clock time `now`: one step per state, each an
/// exhaustive match over the input (no wildcard arm anywhere: a new input or state must be
/// decided in every place).
pub fn step(
    state: &NodeState,
    input: &Input,
    policy: &Policy,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use NodeState as S;
    let at = At { state, policy, now };
    match state {
        S::Unjoined { finished } => unjoined(&at, finished, input),
        S::Joining {
            node,
            phase,
            deadline,
        } => joining(&at, node, *phase, *deadline, input),
        S::Ready { node } => ready(&at, node, input),
        S::Rebooting { node, run, phase } => reboot::rebooting(&at, node, run, *phase, input),
        S::Upgrading {
            node,
            run,
            target,
            candidate,
            phase,
        } => upgrading(
            &at,
            UpgradeCtx {
                node,
                run,
                target,
                candidate,
                phase,
            },
            input,
        ),
        S::Repaving {
            node,
            goal,
            phase,
            deadline,
        } => repaving(&at, node, (goal, phase, *deadline), input),
        S::Resetting {
            node,
            run,
            cause,
            phase,
            deadline,
        } => resetting(
            &at,
            reset::Resetting {
                node,
                run: run.as_ref(),
                cause: *cause,
                phase,
                deadline: *deadline,
            },
            input,
        ),
    }
}

/// What every state's step is given besides its own data.
struct At<'a> {
    state: &'a NodeState,
    policy: &'a Policy,
    now: Timestamp,
}

impl At<'_> {
    fn stay(&self) -> Step {
        Step::stay(self.state)
    }

    /// The operator's `flexnode reset`, ending `run` if one is under way.
    fn reset(&self, node: &NodeInfo, run: Option<&OpRun>) -> Step {
        reset(
            node,
            None,
            ResetCause::Cli,
            run,
            self.policy,
            &DrainPolicy::off(),
            self.now,
        )
    }
}

fn unjoined(at: &At, finished: &FinishedOps, input: &Input) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::Join(req) => Ok(join(finished, req, at.policy, at.now)),
        I::OperationClaimed(_)
        | I::GoalObserved(_)
        | I::ResetRequested
        | I::RecoveryRequested { .. } => Err(Refusal::NotJoined),
        I::EffectsDone | I::EffectsFailed { .. } => {
            Err(Refusal::NothingPending { state: "Unjoined" })
        }
        I::DaemonStarted { .. } | I::Tick => Ok(at.stay()),
    }
}

fn joining(
    at: &At,
    node: &NodeInfo,
    phase: JoinPhase,
    deadline: Timestamp,
    input: &Input,
) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::EffectsDone => Ok(join::effects_done(node, phase, deadline)),
        I::EffectsFailed { message } => Ok(join_failed(node, &format!("join failed: {message}"))),
        I::Tick if at.now >= deadline => Ok(join_failed(node, "join timed out")),
        I::Tick | I::DaemonStarted { .. } => Ok(at.stay()),
        I::ResetRequested => Ok(at.reset(node, None)),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::OperationClaimed(_) | I::GoalObserved(_) => Err(busy(at.state)),
        I::RecoveryRequested { .. } => Err(Refusal::NoUpgradePending),
    }
}

fn ready(at: &At, node: &NodeInfo, input: &Input) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::OperationClaimed(claim) => claim_operation(node, claim, at.policy, at.now),
        I::GoalObserved(obs) => Ok(match decide(obs, &node.applied) {
            // The Node's owner is deleting it (and the pod GC will remove what runs there):
            // the drain does what budgets allow in its time, then the wipe goes ahead.
            GoalDecision::ResetDelete => reset(
                node,
                None,
                ResetCause::DeletionSignal,
                None,
                at.policy,
                &at.policy.drain.going_on(),
                at.now,
            ),
            GoalDecision::ApplyGoal(goal) => repave::start(node, goal, at.policy, at.now),
            GoalDecision::WaitForMachineDelete
            | GoalDecision::WaitForNodeSignal
            | GoalDecision::Noop
            | GoalDecision::Applied => at.stay(),
        }),
        I::DaemonStarted { running, selected } => {
            Ok(daemon_started(at, node, running, selected.as_ref()))
        }
        I::ResetRequested => Ok(at.reset(node, None)),
        I::Tick => Ok(at.stay()),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::EffectsDone | I::EffectsFailed { .. } => Err(Refusal::NothingPending { state: "Ready" }),
        I::RecoveryRequested { .. } => Err(Refusal::NoUpgradePending),
    }
}

/// A daemon started on a node at rest.
fn daemon_started(
    at: &At,
    node: &NodeInfo,
    running: &AgentBuild,
    selected: Option<&AgentBuild>,
) -> Step {
    let ready = |agent: &AgentBuild| NodeState::Ready {
        node: NodeInfo {
            agent: agent.clone(),
            ..node.clone()
        },
    };
    match selected {
        // Another build is selected than runs (the agent restarted mid-switch onto the
        // candidate, and the switch was undone since): the selected build must run.
        Some(selected) if selected != running => {
            Step::to(ready(selected), vec![Effect::RestartAgent])
        }
        Some(_) | None if running == &node.agent => at.stay(),
        // Observation beats memory: record the build that actually runs.
        Some(_) | None => Step::to(ready(running), Vec::new()),
    }
}

fn upgrading(at: &At, u: UpgradeCtx, input: &Input) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::EffectsDone
        | I::EffectsFailed { .. }
        | I::DaemonStarted { .. }
        | I::RecoveryRequested { .. }
        | I::Tick => upgrade_step(at.state, u, input, at.policy, at.now),
        I::ResetRequested => Ok(at.reset(u.node, Some(u.run))),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::OperationClaimed(claim) => Err(refuse_claim(at.state, Some(u.run), claim)),
        I::GoalObserved(_) => Err(busy(at.state)),
    }
}

fn repaving(
    at: &At,
    node: &NodeInfo,
    (goal, phase, deadline): (&Goal, &RepavePhase, Timestamp),
    input: &Input,
) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::EffectsDone => Ok(repave::effects_done(
            node, goal, phase, deadline, at.policy, at.now,
        )),
        I::EffectsFailed { message } => Ok(repave_failure(node, goal, phase, deadline, message)),
        I::Tick => Ok(match phase {
            RepavePhase::Provisioning | RepavePhase::Draining | RepavePhase::SwitchingOver
                if at.now >= deadline =>
            {
                repave_failure(node, goal, phase, deadline, "repave timed out")
            }
            // Bringing the old side back and removing the retired one are never given up
            // at the deadline: a process that finds them interrupted finishes them.
            RepavePhase::Provisioning
            | RepavePhase::Draining
            | RepavePhase::SwitchingOver
            | RepavePhase::RollingBack { .. }
            | RepavePhase::Retiring => at.stay(),
        }),
        I::DaemonStarted { .. } => Ok(at.stay()),
        I::ResetRequested => Ok(at.reset(node, None)),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::OperationClaimed(claim) => Err(refuse_claim(at.state, None, claim)),
        I::GoalObserved(_) => Err(busy(at.state)),
        I::RecoveryRequested { .. } => Err(Refusal::NoUpgradePending),
    }
}

fn resetting(at: &At, r: reset::Resetting, input: &Input) -> Result<Step, Refusal> {
    use Input as I;
    match input {
        I::EffectsDone => Ok(reset::effects_done(
            r.node, r.run, r.cause, r.phase, at.policy, at.now,
        )),
        I::EffectsFailed { .. } | I::Tick => {
            Ok(reset::failed_or_due(at.state, r, input, at.policy, at.now))
        }
        I::DaemonStarted { .. } => Ok(at.stay()),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::OperationClaimed(claim) => Err(refuse_claim(at.state, r.run, claim)),
        I::GoalObserved(_) => Err(busy(at.state)),
        I::ResetRequested => Err(Refusal::ResetUnderWay),
        I::RecoveryRequested { .. } => Err(Refusal::NoUpgradePending),
    }
}

/// Whether `input`, arriving while the effects of the step that entered `state` are
/// unfinished (a crash interrupted them), supersedes them instead of waiting for them: only
/// while a transition is under way (the state has a deadline), only an intervention — the
/// operator's reset, the recovery unit — or a tick past the deadline, and only if `step` takes
/// it. Forward work is then abandoned for the way out the core chose (an undo designed for a
/// half-done step); undos and removals are never given up at a deadline (`Tick` leaves them
/// be), so they are always finished.
pub fn preempts(state: &NodeState, input: &Input, policy: &Policy, now: Timestamp) -> bool {
    let intervention = match input {
        Input::ResetRequested | Input::RecoveryRequested { .. } | Input::Tick => true,
        Input::Join(_)
        | Input::OperationClaimed(_)
        | Input::GoalObserved(_)
        | Input::EffectsDone
        | Input::EffectsFailed { .. }
        | Input::DaemonStarted { .. } => false,
    };
    intervention
        && state.deadline().is_some()
        && step(state, input, policy, now).is_ok_and(|s| s.next != *state || !s.effects.is_empty())
}

/// Publishes a terminal result and returns to rest.
fn finish(node: &NodeInfo, run: &OpRun, reason: ResultReason, message: &str) -> Step {
    Step::to(
        NodeState::Ready {
            node: node.finishing(&run.op.uid),
        },
        vec![Effect::PublishResult {
            op: run.op.clone(),
            result: op_result(run, reason, message),
        }],
    )
}

fn op_result(run: &OpRun, reason: ResultReason, message: &str) -> OpResult {
    OpResult {
        reason,
        message: message.to_string(),
        started_at: run.started_at,
        machine_generation: run.machine_generation,
    }
}

fn machine_report(phase: MachinePhase, message: &str, observed_generation: Option<i64>) -> Effect {
    Effect::ReportMachine {
        phase,
        message: message.to_string(),
        observed_generation,
    }
}

fn busy(state: &NodeState) -> Refusal {
    Refusal::Busy {
        phase: state.phase_name(),
        op: state.run().map(|r| r.op.clone()),
    }
}

fn refuse_claim(state: &NodeState, run: Option<&OpRun>, claim: &Claim) -> Refusal {
    match run {
        Some(run) if run.op.uid == claim.op.uid => Refusal::AlreadyRunning {
            op: claim.op.clone(),
        },
        Some(_) | None => busy(state),
    }
}
