//! AgentUpgrade after the claim: stage, switch, hand off to the successor daemon, and every
//! way back (abort, recovery, deadlines), as one exhaustive match over phase × input.

use super::{MSG_RESTART_FAILED, MSG_SUCCESSOR_MISSING, MSG_UPGRADE_DONE, Step, busy, finish};
use crate::lifecycle::agent::{AgentBuild, UpgradeTarget};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::Input;
use crate::lifecycle::policy::Policy;
use crate::lifecycle::refusal::Refusal;
use crate::lifecycle::result::ResultReason;
use crate::lifecycle::state::{NodeInfo, NodeState, OpRun, UpgradePhase};
use crate::lifecycle::time::Timestamp;

pub(super) struct UpgradeCtx<'a> {
    pub(super) node: &'a NodeInfo,
    pub(super) run: &'a OpRun,
    pub(super) target: &'a UpgradeTarget,
    pub(super) candidate: &'a AgentBuild,
    pub(super) phase: &'a UpgradePhase,
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

pub(super) fn upgrade_step(
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
        (P::HandingOff, I::DaemonStarted { running, .. }) => {
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
            I::DaemonStarted { running, .. },
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
        // The restart onto the old build never came.
        (
            P::RollingBack {
                reason,
                message,
                restart: true,
            },
            I::Tick,
        ) if timed_out => finish(
            u.node,
            u.run,
            *reason,
            &format!("{message}; rollback timed out"),
        ),
        // Waiting: for effects, the successor daemon, or the deadline. An undo is never given
        // up at its deadline: a process that finds one interrupted finishes it
        // (`src/exec/mod.rs`), since the build it undoes may still be selected.
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
