//! The transition function: one exhaustive match over state × input.

use super::decide::{GoalDecision, decide};
use super::effect::{Effect, MachinePhase, OpResult, ResultReason};
use super::input::{Claim, ClaimKind, Input, JoinRequest};
use super::policy::Policy;
use super::refusal::Refusal;
use super::state::{
    AgentBuild, FinishedOps, JoinPhase, NodeInfo, NodeState, OpRun, RepavePhase, ResetCause,
    ResetPhase, Slot, UpgradePhase,
};
use super::time::Timestamp;
use super::validate::{UpgradeTarget, validate_upgrade};

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
        ) => Ok(match phase {
            JoinPhase::Installing => Step::to(
                S::Joining {
                    node: node.clone(),
                    phase: JoinPhase::Starting,
                    deadline: *deadline,
                },
                vec![Effect::StartAgent],
            ),
            JoinPhase::Starting => Step::to(
                S::Ready { node: node.clone() },
                vec![machine_report(
                    MachinePhase::Ready,
                    "node joined",
                    Some(node.applied.generation),
                )],
            ),
        }),
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
            GoalDecision::ApplyGoal(goal) => Step::to(
                S::Repaving {
                    node: node.clone(),
                    goal: goal.clone(),
                    phase: RepavePhase::Provisioning,
                    deadline: now.plus_secs(policy.repave_secs),
                },
                vec![
                    machine_report(
                        MachinePhase::Provisioning,
                        &format!("repaving to {}", node.active.other().name()),
                        None,
                    ),
                    Effect::ProvisionMachine {
                        side: node.active.other(),
                        kubernetes_version: goal.kubernetes_version,
                    },
                ],
            ),
            GoalDecision::WaitForMachineDelete
            | GoalDecision::WaitForNodeSignal
            | GoalDecision::Noop
            | GoalDecision::Applied => Step::stay(state),
        }),
        (S::Ready { .. }, I::EffectsDone | I::EffectsFailed { .. }) => {
            Err(Refusal::NothingPending { state: "Ready" })
        }
        // Observation beats memory: record the build that actually runs.
        (S::Ready { node }, I::DaemonStarted { running }) => Ok(if *running == node.agent {
            Step::stay(state)
        } else {
            Step::to(
                S::Ready {
                    node: NodeInfo {
                        agent: running.clone(),
                        ..node.clone()
                    },
                },
                Vec::new(),
            )
        }),
        (S::Ready { node }, I::ResetRequested) => {
            Ok(reset(node, None, ResetCause::Cli, None, policy, now))
        }
        (S::Ready { .. }, I::Tick) => Ok(Step::stay(state)),

        // ---- NodeReboot ----------------------------------------------------------------
        (S::Rebooting { node, run }, I::EffectsDone) => {
            Ok(finish(node, run, ResultReason::Succeeded, MSG_REBOOT_DONE))
        }
        (S::Rebooting { node, run }, I::EffectsFailed { message }) => {
            Ok(finish(node, run, ResultReason::ExecutionFailed, message))
        }
        (S::Rebooting { node, run }, I::Tick) => Ok(if now >= run.deadline {
            finish(
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
        ) => {
            let from = node.active;
            let to = from.other();
            Ok(match phase {
                RepavePhase::Provisioning => Step::to(
                    S::Repaving {
                        node: node.clone(),
                        goal: goal.clone(),
                        phase: RepavePhase::SwitchingOver,
                        deadline: *deadline,
                    },
                    vec![
                        Effect::StopMachine { side: from },
                        Effect::StartMachine { side: to },
                    ],
                ),
                RepavePhase::SwitchingOver => Step::to(
                    S::Repaving {
                        node: NodeInfo {
                            active: to,
                            previous: Some(node.applied.clone()),
                            applied: goal.clone(),
                            ..node.clone()
                        },
                        goal: goal.clone(),
                        phase: RepavePhase::Retiring,
                        deadline: *deadline,
                    },
                    vec![Effect::RemoveMachine { side: from }],
                ),
                RepavePhase::RollingBack { message } => repave_failed(
                    node,
                    &format!(
                        "repave to {} failed and was rolled back: {message}",
                        to.name()
                    ),
                ),
                RepavePhase::Retiring => repave_done(node),
            })
        }
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
        ) => Ok(if now >= *deadline {
            repave_failure(node, goal, phase, *deadline, "repave timed out")
        } else {
            Step::stay(state)
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
        ) => Ok(match (phase, run) {
            (ResetPhase::Wiping, Some(run)) => {
                let result = op_result(run, ResultReason::Succeeded, MSG_RESET_DONE);
                Step::to(
                    S::Resetting {
                        node: node.finishing(&run.op.uid),
                        run: Some(OpRun {
                            deadline: now.plus_secs(policy.publish_secs),
                            ..run.clone()
                        }),
                        cause: *cause,
                        phase: ResetPhase::Publishing,
                        deadline: now.plus_secs(policy.publish_secs),
                    },
                    vec![
                        Effect::PublishResult {
                            op: run.op.clone(),
                            result,
                        },
                        Effect::AwaitPublished { op: run.op.clone() },
                    ],
                )
            }
            (ResetPhase::Wiping | ResetPhase::Publishing, _)
            | (ResetPhase::Uninstalling, Some(_)) => uninstall(node, *cause, policy, now),
            (ResetPhase::Uninstalling, None) => Step::to(
                S::Unjoined {
                    finished: node.finished.clone(),
                },
                Vec::new(),
            ),
        }),
        (
            S::Resetting {
                node,
                run,
                cause,
                phase,
                deadline,
            },
            input @ (I::EffectsFailed { .. } | I::Tick),
        ) => {
            let message = match input {
                I::EffectsFailed { message } => Some(message.as_str()),
                I::Tick if now >= *deadline => Some("reset timed out"),
                I::Tick
                | I::Join(_)
                | I::OperationClaimed(_)
                | I::GoalObserved(_)
                | I::EffectsDone
                | I::DaemonStarted { .. }
                | I::RecoveryRequested { .. }
                | I::ResetRequested => None,
            };
            let Some(message) = message else {
                return Ok(Step::stay(state));
            };
            Ok(match (phase, run) {
                (ResetPhase::Wiping, Some(run)) => {
                    finish(node, run, ResultReason::ExecutionFailed, message)
                }
                (ResetPhase::Wiping, None) => Step::to(
                    S::Ready { node: node.clone() },
                    vec![machine_report(
                        MachinePhase::Failed,
                        &format!("{cause} failed: {message}"),
                        None,
                    )],
                ),
                // Keep trying to publish (bounded), then go anyway: the result stays
                // in the store and is re-published by a later daemon.
                (ResetPhase::Publishing, Some(run))
                    if now < *deadline && run.attempt < policy.publish_attempts =>
                {
                    Step::to(
                        S::Resetting {
                            node: node.clone(),
                            run: Some(OpRun {
                                attempt: run.attempt + 1,
                                ..run.clone()
                            }),
                            cause: *cause,
                            phase: ResetPhase::Publishing,
                            deadline: *deadline,
                        },
                        vec![Effect::AwaitPublished { op: run.op.clone() }],
                    )
                }
                (ResetPhase::Publishing, _) => uninstall(node, *cause, policy, now),
                (ResetPhase::Uninstalling, _) => Step::to(
                    S::Unjoined {
                        finished: node.finished.clone(),
                    },
                    Vec::new(),
                ),
            })
        }
        (S::Resetting { run, .. }, I::OperationClaimed(claim)) => {
            Err(refuse_claim(state, run.as_ref(), claim))
        }
        (S::Resetting { .. }, I::ResetRequested) => Err(Refusal::ResetUnderWay),
        (S::Resetting { .. }, I::RecoveryRequested { .. }) => Err(Refusal::NoUpgradePending),
    }
}

fn join(finished: &FinishedOps, req: &JoinRequest, policy: &Policy, now: Timestamp) -> Step {
    let node = NodeInfo {
        name: req.node_name.clone(),
        mode: req.mode,
        arch: req.arch,
        active: super::state::Side::Kube1,
        applied: req.goal.clone(),
        previous: None,
        agent: req.agent.clone(),
        last_good: None,
        finished: finished.clone(),
    };
    Step::to(
        NodeState::Joining {
            node: node.clone(),
            phase: JoinPhase::Installing,
            deadline: now.plus_secs(policy.join_secs),
        },
        vec![
            machine_report(MachinePhase::Joining, "joining", None),
            Effect::InstallAgent {
                mode: req.mode,
                build: req.agent.clone(),
            },
            Effect::WriteUnits { mode: req.mode },
            Effect::ProvisionMachine {
                side: node.active,
                kubernetes_version: req.goal.kubernetes_version.clone(),
            },
            Effect::StartMachine { side: node.active },
        ],
    )
}

fn join_failed(node: &NodeInfo, message: &str) -> Step {
    Step::to(
        NodeState::Unjoined {
            finished: node.finished.clone(),
        },
        vec![machine_report(MachinePhase::Failed, message, None)],
    )
}

fn claim_operation(
    node: &NodeInfo,
    claim: &Claim,
    policy: &Policy,
    now: Timestamp,
) -> Result<Step, Refusal> {
    if node.finished.contains(&claim.op.uid) {
        return Err(Refusal::AlreadyFinished {
            op: claim.op.clone(),
        });
    }
    let run = |secs: i64| OpRun {
        op: claim.op.clone(),
        started_at: now,
        deadline: now.plus_secs(secs),
        attempt: 1,
        machine_generation: claim.machine_generation,
    };
    let op = claim.op.clone();
    Ok(match &claim.kind {
        ClaimKind::NodeReboot => Step::to(
            NodeState::Rebooting {
                node: node.clone(),
                run: run(policy.reboot_secs),
            },
            vec![
                Effect::ReportProgress {
                    op,
                    message: format!("restarting active nspawn machine {}", node.active.name()),
                },
                Effect::RestartMachine {
                    side: node.active,
                    not_before: now,
                },
            ],
        ),
        ClaimKind::AgentReset => Step::to(
            NodeState::Resetting {
                node: node.clone(),
                run: Some(run(policy.reset_secs)),
                cause: ResetCause::Operation,
                phase: ResetPhase::Wiping,
                deadline: now.plus_secs(policy.reset_secs),
            },
            vec![
                Effect::ReportProgress {
                    op,
                    message: "resetting local nspawn node runtime".into(),
                },
                Effect::WipeNode,
            ],
        ),
        ClaimKind::AgentUpgrade { parameters } => {
            match validate_upgrade(node.mode, node.arch, parameters) {
                Err(invalid) => finish(
                    node,
                    &run(0),
                    ResultReason::InvalidParameters,
                    invalid.message(),
                ),
                Ok(target) => {
                    let candidate = candidate_for(node, &target);
                    Step::to(
                        NodeState::Upgrading {
                            node: node.clone(),
                            run: run(policy.stage_secs),
                            target: target.clone(),
                            candidate: candidate.clone(),
                            phase: UpgradePhase::Staging,
                        },
                        vec![
                            Effect::ReportProgress {
                                op,
                                message: "staging upgraded agent".into(),
                            },
                            Effect::StageAgent { target, candidate },
                        ],
                    )
                }
            }
        }
        ClaimKind::Unsupported { kind } => finish(
            node,
            &run(0),
            ResultReason::UnsupportedOperation,
            &format!("operation kind {kind} is not supported by the flexnode daemon"),
        ),
    })
}

/// Host install: the slot `current` does not point to. Container install: the image itself.
fn candidate_for(node: &NodeInfo, target: &UpgradeTarget) -> AgentBuild {
    match target {
        UpgradeTarget::Archive { .. } => AgentBuild::Slot {
            slot: match &node.agent {
                AgentBuild::Slot { slot } => slot.other(),
                AgentBuild::Image { .. } => Slot::Blue,
            },
        },
        UpgradeTarget::Image { digest, .. } => AgentBuild::Image {
            digest: digest.clone(),
        },
    }
}

struct UpgradeCtx<'a> {
    node: &'a NodeInfo,
    run: &'a OpRun,
    target: &'a UpgradeTarget,
    candidate: &'a AgentBuild,
    phase: &'a UpgradePhase,
}

impl UpgradeCtx<'_> {
    fn with_phase(&self, phase: UpgradePhase, deadline: Timestamp) -> NodeState {
        NodeState::Upgrading {
            node: self.node.clone(),
            run: OpRun {
                deadline,
                ..self.run.clone()
            },
            target: self.target.clone(),
            candidate: self.candidate.clone(),
            phase,
        }
    }

    fn switch_back(&self) -> Effect {
        Effect::SwitchAgent {
            mode: self.node.mode,
            to: self.node.agent.clone(),
            last_good: self.node.agent.clone(),
        }
    }

    /// Abort: undo what the phase did, then publish `reason` once the undo is done.
    fn abort(&self, message: &str, undo: Vec<Effect>, policy: &Policy, now: Timestamp) -> Step {
        Step::to(
            self.with_phase(
                UpgradePhase::RollingBack {
                    reason: ResultReason::ExecutionFailed,
                    message: message.to_string(),
                    restart: false,
                },
                now.plus_secs(policy.rollback_secs),
            ),
            undo,
        )
    }

    /// The node after a failed upgrade running `running`: a slot candidate overwrote the old
    /// last-good slot, so no last-good build is left; an older image still is one.
    fn node_after_failure(&self, running: &AgentBuild) -> NodeInfo {
        NodeInfo {
            agent: running.clone(),
            last_good: match self.candidate {
                AgentBuild::Slot { .. } => None,
                AgentBuild::Image { .. } => self.node.last_good.clone(),
            },
            ..self.node.clone()
        }
    }

    /// The daemon that started after a hand-off or recovery decides the result.
    fn judge(&self, running: &AgentBuild, reason: ResultReason, message: &str) -> Step {
        // A candidate left running keeps the old build as its last-good.
        let node = if *running == *self.candidate {
            NodeInfo {
                agent: running.clone(),
                last_good: Some(self.node.agent.clone()),
                ..self.node.clone()
            }
        } else {
            self.node_after_failure(running)
        };
        finish(&node, self.run, reason, message)
    }
}

fn upgrade_step(
    state: &NodeState,
    u: UpgradeCtx<'_>,
    input: &Input,
    policy: &Policy,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use Input as I;
    use UpgradePhase as P;
    let timed_out = now >= u.run.deadline;
    let discard = || Effect::DiscardCandidate {
        candidate: u.candidate.clone(),
    };
    Ok(match (u.phase, input) {
        (P::Staging, I::EffectsDone) => Step::to(
            u.with_phase(P::Switching, now.plus_secs(policy.switch_secs)),
            vec![Effect::SwitchAgent {
                mode: u.node.mode,
                to: u.candidate.clone(),
                last_good: u.node.agent.clone(),
            }],
        ),
        (P::Switching, I::EffectsDone) => Step::to(
            u.with_phase(P::HandingOff, now.plus_secs(policy.handoff_secs)),
            vec![Effect::ScheduleAgentRestart {
                delay_ms: policy.restart_delay_ms,
            }],
        ),
        (P::Staging, I::EffectsFailed { message }) => {
            u.abort(message, vec![discard()], policy, now)
        }
        (P::Staging, I::Tick) if timed_out => {
            u.abort("staging timed out", vec![discard()], policy, now)
        }
        (P::Switching, I::EffectsFailed { message }) => {
            u.abort(message, vec![u.switch_back()], policy, now)
        }
        (P::Switching, I::Tick) if timed_out => {
            u.abort("switching timed out", vec![u.switch_back()], policy, now)
        }
        (P::HandingOff, I::EffectsFailed { .. }) => {
            u.abort(MSG_RESTART_FAILED, vec![u.switch_back()], policy, now)
        }
        (P::HandingOff, I::Tick) if timed_out => {
            u.abort(MSG_RESTART_FAILED, vec![u.switch_back()], policy, now)
        }
        (P::HandingOff, I::DaemonStarted { running }) => {
            if running == u.candidate {
                u.judge(running, ResultReason::Succeeded, MSG_UPGRADE_DONE)
            } else {
                u.judge(running, ResultReason::DaemonFailed, MSG_SUCCESSOR_MISSING)
            }
        }
        // The recovery unit (running the last-good build) found the agent crash-looping.
        (P::Staging | P::Switching | P::HandingOff, I::RecoveryRequested { message }) => {
            let undo = match u.phase {
                P::Staging => vec![discard(), Effect::RestartAgent],
                P::Switching | P::HandingOff | P::RollingBack { .. } => {
                    vec![u.switch_back(), Effect::RestartAgent]
                }
            };
            Step::to(
                u.with_phase(
                    P::RollingBack {
                        reason: ResultReason::DaemonFailed,
                        message: message.clone(),
                        restart: true,
                    },
                    now.plus_secs(policy.rollback_secs),
                ),
                undo,
            )
        }
        (P::RollingBack { .. }, I::RecoveryRequested { .. }) => {
            return Err(Refusal::NoUpgradePending);
        }
        (
            P::RollingBack {
                reason,
                message,
                restart: false,
            },
            I::EffectsDone,
        ) => finish(
            &u.node_after_failure(&u.node.agent),
            u.run,
            *reason,
            message,
        ),
        // The undo failed: restart onto whatever is selected and let that daemon report.
        (
            P::RollingBack {
                reason,
                message,
                restart: false,
            },
            I::EffectsFailed { message: why },
        ) => Step::to(
            u.with_phase(
                P::RollingBack {
                    reason: *reason,
                    message: format!("{message}; rollback failed: {why}"),
                    restart: true,
                },
                now.plus_secs(policy.rollback_secs),
            ),
            vec![Effect::RestartAgent],
        ),
        (
            P::RollingBack {
                reason,
                message,
                restart: true,
            },
            I::DaemonStarted { running },
        ) => u.judge(running, *reason, message),
        (
            P::RollingBack {
                reason,
                message,
                restart: true,
            },
            I::EffectsFailed { message: why },
        ) => finish(
            u.node,
            u.run,
            *reason,
            &format!("{message}; restarting the agent failed: {why}"),
        ),
        (
            P::RollingBack {
                reason, message, ..
            },
            I::Tick,
        ) if timed_out => finish(
            u.node,
            u.run,
            *reason,
            &format!("{message}; rollback timed out"),
        ),
        // Waiting: for effects, the successor daemon, or the deadline.
        (P::HandingOff | P::RollingBack { restart: true, .. }, I::EffectsDone)
        | (
            P::Staging | P::Switching | P::RollingBack { restart: false, .. },
            I::DaemonStarted { .. },
        )
        | (P::Staging | P::Switching | P::HandingOff | P::RollingBack { .. }, I::Tick) => {
            Step::stay(state)
        }
        (
            P::Staging | P::Switching | P::HandingOff | P::RollingBack { .. },
            I::Join(_) | I::OperationClaimed(_) | I::GoalObserved(_) | I::ResetRequested,
        ) => return Err(busy(state)),
    })
}

fn repave_failure(
    node: &NodeInfo,
    goal: &super::state::Goal,
    phase: &RepavePhase,
    deadline: Timestamp,
    message: &str,
) -> Step {
    let from = node.active;
    let to = from.other();
    match phase {
        // The old side never stopped: drop the half-built new side.
        RepavePhase::Provisioning => {
            let mut step =
                repave_failed(node, &format!("repave to {} failed: {message}", to.name()));
            step.effects.insert(0, Effect::RemoveMachine { side: to });
            step
        }
        // Beyond the anchor: the old side was stopped, so bring it back.
        RepavePhase::SwitchingOver => Step::to(
            NodeState::Repaving {
                node: node.clone(),
                goal: goal.clone(),
                phase: RepavePhase::RollingBack {
                    message: message.to_string(),
                },
                deadline,
            },
            vec![
                Effect::StopMachine { side: to },
                Effect::StartMachine { side: from },
            ],
        ),
        RepavePhase::RollingBack { message: first } => repave_failed(
            node,
            &format!(
                "repave to {} failed ({first}) and the rollback failed: {message}",
                to.name()
            ),
        ),
        // The new side runs; a leftover old side is only untidy.
        RepavePhase::Retiring => repave_done(node),
    }
}

fn repave_failed(node: &NodeInfo, message: &str) -> Step {
    Step::to(
        NodeState::Ready { node: node.clone() },
        vec![machine_report(MachinePhase::Failed, message, None)],
    )
}

fn repave_done(node: &NodeInfo) -> Step {
    Step::to(
        NodeState::Ready { node: node.clone() },
        vec![machine_report(
            MachinePhase::Ready,
            "machine goal state applied",
            Some(node.applied.generation),
        )],
    )
}

/// Starts a reset. An operation interrupted by it gets a published result first.
fn reset(
    node: &NodeInfo,
    run: Option<&OpRun>,
    cause: ResetCause,
    abandoned: Option<&OpRun>,
    policy: &Policy,
    now: Timestamp,
) -> Step {
    let mut effects = Vec::new();
    let mut node = node.clone();
    if let Some(old) = abandoned {
        effects.push(Effect::PublishResult {
            op: old.op.clone(),
            result: op_result(old, ResultReason::ExecutionFailed, MSG_INTERRUPTED_BY_RESET),
        });
        node = node.finishing(&old.op.uid);
    }
    effects.push(Effect::WipeNode);
    Step::to(
        NodeState::Resetting {
            node,
            run: run.cloned(),
            cause,
            phase: ResetPhase::Wiping,
            deadline: now.plus_secs(policy.reset_secs),
        },
        effects,
    )
}

fn uninstall(node: &NodeInfo, cause: ResetCause, policy: &Policy, now: Timestamp) -> Step {
    Step::to(
        NodeState::Resetting {
            node: node.clone(),
            run: None,
            cause,
            phase: ResetPhase::Uninstalling,
            deadline: now.plus_secs(policy.reset_secs),
        },
        vec![Effect::UninstallAgent],
    )
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
