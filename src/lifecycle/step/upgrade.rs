//! AgentUpgrade after the claim: stage, switch, hand off to the successor daemon, and every
//! way back (abort, recovery, deadlines): one step per input, each exhaustive over the phase.

use super::{MSG_RESTART_FAILED, MSG_SUCCESSOR_MISSING, MSG_UPGRADE_DONE, Step, busy, finish};
use crate::lifecycle::agent::{AgentBuild, UpgradeTarget};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::Input;
use crate::lifecycle::policy::Policy;
use crate::lifecycle::refusal::Refusal;
use crate::lifecycle::result::ResultReason;
use crate::lifecycle::state::{NodeInfo, NodeState, OpRun, UpgradePhase};
use crate::lifecycle::time::Timestamp;
use UpgradePhase as P;

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

/// The upgrade's next step for `input`: one named step per input, each an exhaustive match
/// over the phase.
pub(super) fn upgrade_step(
    state: &NodeState,
    u: UpgradeCtx<'_>,
    input: &Input,
    policy: &Policy,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use Input as I;
    Ok(match input {
        I::EffectsDone => u.effects_done(state, policy, now),
        I::EffectsFailed { message } => u.effects_failed(message, policy, now),
        I::DaemonStarted { running, .. } => u.daemon_started(state, running),
        I::RecoveryRequested { message } => u.recovery(message, policy, now)?,
        I::Tick => u.tick(state, policy, now),
        I::Join(_) | I::OperationClaimed(_) | I::GoalObserved(_) | I::ResetRequested => {
            return Err(busy(state));
        }
    })
}

impl UpgradeCtx<'_> {
    fn discard(&self) -> Effect {
        Effect::DiscardCandidate {
            candidate: self.candidate.clone(),
        }
    }

    /// A phase's effects done: the next phase, or the rollback's result.
    fn effects_done(&self, state: &NodeState, policy: &Policy, now: Timestamp) -> Step {
        match self.phase {
            P::Staging => Step::to(
                self.with_phase(P::Switching, now.plus_secs(policy.switch_secs)),
                vec![Effect::SwitchAgent {
                    mode: self.node.mode,
                    to: self.candidate.clone(),
                    last_good: self.node.agent.clone(),
                }],
            ),
            P::Switching => Step::to(
                self.with_phase(P::HandingOff, now.plus_secs(policy.handoff_secs)),
                vec![Effect::ScheduleAgentRestart {
                    delay_ms: policy.restart_delay_ms,
                }],
            ),
            P::RollingBack {
                reason,
                message,
                restart: false,
            } => finish(
                &self.node_after_failure(&self.node.agent),
                self.run,
                *reason,
                message,
            ),
            // Waiting for the successor daemon (or the restarted old one).
            P::HandingOff | P::RollingBack { restart: true, .. } => Step::stay(state),
        }
    }

    /// A phase's effects failed: undo it; an undo that failed restarts onto whatever is
    /// selected and lets that daemon report.
    fn effects_failed(&self, why: &str, policy: &Policy, now: Timestamp) -> Step {
        match self.phase {
            P::Staging => self.abort(why, vec![self.discard()], policy, now),
            P::Switching => self.abort(why, vec![self.switch_back()], policy, now),
            P::HandingOff => self.abort(MSG_RESTART_FAILED, vec![self.switch_back()], policy, now),
            P::RollingBack {
                reason,
                message,
                restart: false,
            } => Step::to(
                self.with_phase(
                    P::RollingBack {
                        reason: *reason,
                        message: format!("{message}; rollback failed: {why}"),
                        restart: true,
                    },
                    now.plus_secs(policy.rollback_secs),
                ),
                vec![Effect::RestartAgent],
            ),
            P::RollingBack {
                reason,
                message,
                restart: true,
            } => finish(
                self.node,
                self.run,
                *reason,
                &format!("{message}; restarting the agent failed: {why}"),
            ),
        }
    }

    /// A daemon started: after a hand-off or a restarting rollback, it decides the result.
    fn daemon_started(&self, state: &NodeState, running: &AgentBuild) -> Step {
        match self.phase {
            P::HandingOff if running == self.candidate => {
                self.judge(running, ResultReason::Succeeded, MSG_UPGRADE_DONE)
            }
            P::HandingOff => self.judge(running, ResultReason::DaemonFailed, MSG_SUCCESSOR_MISSING),
            P::RollingBack {
                reason,
                message,
                restart: true,
            } => self.judge(running, *reason, message),
            P::Staging | P::Switching | P::RollingBack { restart: false, .. } => Step::stay(state),
        }
    }

    /// The recovery unit (running the last-good build) found the agent crash-looping.
    fn recovery(&self, message: &str, policy: &Policy, now: Timestamp) -> Result<Step, Refusal> {
        let undo = match self.phase {
            P::Staging => vec![self.discard(), Effect::RestartAgent],
            P::Switching | P::HandingOff => vec![self.switch_back(), Effect::RestartAgent],
            P::RollingBack { .. } => return Err(Refusal::NoUpgradePending),
        };
        Ok(Step::to(
            self.with_phase(
                P::RollingBack {
                    reason: ResultReason::DaemonFailed,
                    message: message.to_string(),
                    restart: true,
                },
                now.plus_secs(policy.rollback_secs),
            ),
            undo,
        ))
    }

    /// Time passed: past the deadline a forward phase is undone and a restart that never came
    /// ends the operation. An undo is never given up at its deadline: a process that finds
    /// one interrupted finishes it (`src/exec/mod.rs`), since the build it undoes may still be
    /// selected.
    fn tick(&self, state: &NodeState, policy: &Policy, now: Timestamp) -> Step {
        if now < self.run.deadline {
            return Step::stay(state);
        }
        match self.phase {
            P::Staging => self.abort("staging timed out", vec![self.discard()], policy, now),
            P::Switching => {
                self.abort("switching timed out", vec![self.switch_back()], policy, now)
            }
            P::HandingOff => self.abort(MSG_RESTART_FAILED, vec![self.switch_back()], policy, now),
            P::RollingBack {
                reason,
                message,
                restart: true,
            } => finish(
                self.node,
                self.run,
                *reason,
                &format!("{message}; rollback timed out"),
            ),
            P::RollingBack { restart: false, .. } => Step::stay(state),
        }
    }
}
