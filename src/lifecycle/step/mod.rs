//! The transition function: one exhaustive match over state × input (here), with the work of
//! each family of transitions in its own file: join, claim, upgrade, repave, reset.

mod claim;
mod join;
mod repave;
mod reset;
mod upgrade;

use super::decide::{GoalDecision, decide};
use super::effect::Effect;
use super::input::{Claim, Input};
use super::policy::Policy;
use super::refusal::Refusal;
use super::result::{MachinePhase, OpResult, ResultReason};
use super::state::{NodeInfo, NodeState, OpRun, RepavePhase, ResetCause};
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

/// Decides what `input` means in `state` at wall-clock time `now`.
pub fn step(
    state: &NodeState,
    input: &Input,
    policy: &Policy,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use Input as I;
    use NodeState as S;
    match (state, input) {
        // ---- joining -------------------------------------------------------------------
        (S::Unjoined { finished }, I::Join(req)) => Ok(join(finished, req, policy, now)),
        (
            S::Joining { .. }
            | S::Ready { .. }
            | S::Rebooting { .. }
            | S::Upgrading { .. }
            | S::Repaving { .. }
            | S::Resetting { .. },
            I::Join(_),
        ) => Err(Refusal::AlreadyJoined),
        (
            S::Unjoined { .. },
            I::OperationClaimed(_)
            | I::GoalObserved(_)
            | I::ResetRequested
            | I::RecoveryRequested { .. },
        ) => Err(Refusal::NotJoined),
        (S::Unjoined { .. }, I::EffectsDone | I::EffectsFailed { .. }) => {
            Err(Refusal::NothingPending { state: "Unjoined" })
        }
        (S::Unjoined { .. }, I::DaemonStarted { .. } | I::Tick) => Ok(Step::stay(state)),

        (
            S::Joining {
                node,
                phase,
                deadline,
            },
            I::EffectsDone,
        ) => Ok(join::effects_done(node, *phase, *deadline)),
        (S::Joining { node, .. }, I::EffectsFailed { message }) => {
            Ok(join_failed(node, &format!("join failed: {message}")))
        }
        (S::Joining { node, deadline, .. }, I::Tick) => Ok(if now >= *deadline {
            join_failed(node, "join timed out")
        } else {
            Step::stay(state)
        }),
        (S::Joining { .. }, I::OperationClaimed(_) | I::GoalObserved(_)) => Err(busy(state)),
        (S::Joining { node, .. }, I::ResetRequested) => {
            Ok(reset(node, None, ResetCause::Cli, None, policy, now))
        }
        (
            S::Joining { .. } | S::Ready { .. } | S::Rebooting { .. } | S::Repaving { .. },
            I::RecoveryRequested { .. },
        ) => Err(Refusal::NoUpgradePending),
        (S::Joining { .. }, I::DaemonStarted { .. }) => Ok(Step::stay(state)),

        // ---- ready ---------------------------------------------------------------------
        (S::Ready { node }, I::OperationClaimed(claim)) => {
            claim_operation(node, claim, policy, now)
        }
        (S::Ready { node }, I::GoalObserved(obs)) => Ok(match decide(obs, &node.applied) {
            GoalDecision::ResetDelete => {
                reset(node, None, ResetCause::DeletionSignal, None, policy, now)
            }
            GoalDecision::ApplyGoal(goal) => repave::start(node, goal, policy, now),
            GoalDecision::WaitForMachineDelete
            | GoalDecision::WaitForNodeSignal
            | GoalDecision::Noop
            | GoalDecision::Applied => Step::stay(state),
        }),
        (S::Ready { .. }, I::EffectsDone | I::EffectsFailed { .. }) => {
            Err(Refusal::NothingPending { state: "Ready" })
        }
        (S::Ready { node }, I::DaemonStarted { running, selected }) => Ok(match selected {
            // Another build is selected than runs (the agent restarted mid-switch onto the
            // candidate, and the switch was undone since): the selected build must run.
            Some(selected) if selected != running => Step::to(
                S::Ready {
                    node: NodeInfo {
                        agent: selected.clone(),
                        ..node.clone()
                    },
                },
                vec![Effect::RestartAgent],
            ),
            Some(_) | None if running == &node.agent => Step::stay(state),
            // Observation beats memory: record the build that actually runs.
            Some(_) | None => Step::to(
                S::Ready {
                    node: NodeInfo {
                        agent: running.clone(),
                        ..node.clone()
                    },
                },
                Vec::new(),
            ),
        }),
        (S::Ready { node }, I::ResetRequested) => {
            Ok(reset(node, None, ResetCause::Cli, None, policy, now))
        }
        (S::Ready { .. }, I::Tick) => Ok(Step::stay(state)),

        // ---- NodeReboot ----------------------------------------------------------------
        (S::Rebooting { node, run }, I::EffectsDone) => Ok(finish_reboot(
            node,
            run,
            ResultReason::Succeeded,
            MSG_REBOOT_DONE,
        )),
        (S::Rebooting { node, run }, I::EffectsFailed { message }) => Ok(finish_reboot(
            node,
            run,
            ResultReason::ExecutionFailed,
            message,
        )),
        (S::Rebooting { node, run }, I::Tick) => Ok(if now >= run.deadline {
            finish_reboot(
                node,
                run,
                ResultReason::ExecutionFailed,
                "NodeReboot timed out",
            )
        } else {
            Step::stay(state)
        }),
        (S::Rebooting { run, .. } | S::Upgrading { run, .. }, I::OperationClaimed(claim)) => {
            Err(refuse_claim(state, Some(run), claim))
        }
        (
            S::Rebooting { .. } | S::Upgrading { .. } | S::Repaving { .. } | S::Resetting { .. },
            I::GoalObserved(_),
        ) => Err(busy(state)),
        (
            S::Rebooting { .. } | S::Repaving { .. } | S::Resetting { .. },
            I::DaemonStarted { .. },
        ) => Ok(Step::stay(state)),
        (S::Rebooting { node, run } | S::Upgrading { node, run, .. }, I::ResetRequested) => {
            Ok(reset(node, None, ResetCause::Cli, Some(run), policy, now))
        }

        // ---- AgentUpgrade --------------------------------------------------------------
        (
            S::Upgrading {
                node,
                run,
                target,
                candidate,
                phase,
            },
            input @ (I::EffectsDone
            | I::EffectsFailed { .. }
            | I::DaemonStarted { .. }
            | I::RecoveryRequested { .. }
            | I::Tick),
        ) => upgrade_step(
            state,
            UpgradeCtx {
                node,
                run,
                target,
                candidate,
                phase,
            },
            input,
            policy,
            now,
        ),

        // ---- repave --------------------------------------------------------------------
        (
            S::Repaving {
                node,
                goal,
                phase,
                deadline,
            },
            I::EffectsDone,
        ) => Ok(repave::effects_done(node, goal, phase, *deadline)),
        (
            S::Repaving {
                node,
                goal,
                phase,
                deadline,
            },
            I::EffectsFailed { message },
        ) => Ok(repave_failure(node, goal, phase, *deadline, message)),
        (
            S::Repaving {
                node,
                goal,
                phase,
                deadline,
            },
            I::Tick,
        ) => Ok(match phase {
            RepavePhase::Provisioning | RepavePhase::SwitchingOver if now >= *deadline => {
                repave_failure(node, goal, phase, *deadline, "repave timed out")
            }
            // Bringing the old side back and removing the retired one are never given up
            // at the deadline: a process that finds them interrupted finishes them.
            RepavePhase::Provisioning
            | RepavePhase::SwitchingOver
            | RepavePhase::RollingBack { .. }
            | RepavePhase::Retiring => Step::stay(state),
        }),
        (S::Repaving { .. }, I::OperationClaimed(claim)) => Err(refuse_claim(state, None, claim)),
        (S::Repaving { node, .. }, I::ResetRequested) => {
            Ok(reset(node, None, ResetCause::Cli, None, policy, now))
        }

        // ---- reset ---------------------------------------------------------------------
        (
            S::Resetting {
                node,
                run,
                cause,
                phase,
                ..
            },
            I::EffectsDone,
        ) => Ok(reset::effects_done(
            node,
            run.as_ref(),
            *cause,
            phase,
            policy,
            now,
        )),
        (
            S::Resetting {
                node,
                run,
                cause,
                phase,
                deadline,
            },
            input @ (I::EffectsFailed { .. } | I::Tick),
        ) => Ok(reset::failed_or_due(
            state,
            reset::Resetting {
                node,
                run: run.as_ref(),
                cause: *cause,
                phase,
                deadline: *deadline,
            },
            input,
            policy,
            now,
        )),
        (S::Resetting { run, .. }, I::OperationClaimed(claim)) => {
            Err(refuse_claim(state, run.as_ref(), claim))
        }
        (S::Resetting { .. }, I::ResetRequested) => Err(Refusal::ResetUnderWay),
        (S::Resetting { .. }, I::RecoveryRequested { .. }) => Err(Refusal::NoUpgradePending),
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

/// A reboot's end also ends the Machine's `Rebooting`: its phase is `Ready` again, and its
/// applied settings version unchanged.
fn finish_reboot(node: &NodeInfo, run: &OpRun, reason: ResultReason, message: &str) -> Step {
    let mut step = finish(node, run, reason, message);
    step.effects.push(machine_report(
        MachinePhase::Ready,
        &format!("{} is over: {message}", run.op.name),
        Some(node.applied.generation),
    ));
    step
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
