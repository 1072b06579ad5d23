//! Reset (AgentReset, the deletion signal, `flexnode reset`): wipe the node, publish the
//! operation's result before the daemon goes, uninstall the agent.

use super::{MSG_INTERRUPTED_BY_RESET, MSG_RESET_DONE, Step, finish, machine_report, op_result};
use crate::lifecycle::drain::{DrainPolicy, HOLDER_DELETION, holder_for_operation};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::Input;
use crate::lifecycle::policy::Policy;
use crate::lifecycle::result::{MachinePhase, ResultReason};
use crate::lifecycle::state::{NodeInfo, NodeState, OpRun, ResetCause, ResetPhase};
use crate::lifecycle::time::Timestamp;

/// A `Resetting` state's fields.
pub(super) struct Resetting<'a> {
    pub node: &'a NodeInfo,
    pub run: Option<&'a OpRun>,
    pub cause: ResetCause,
    pub phase: &'a ResetPhase,
    pub deadline: Timestamp,
}

/// Starts a reset: the drain first when `drain` is on, else the wipe. An operation
/// interrupted by it gets a published result first.
pub(super) fn reset(
    node: &NodeInfo,
    run: Option<&OpRun>,
    cause: ResetCause,
    abandoned: Option<&OpRun>,
    policy: &Policy,
    drain: &DrainPolicy,
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
    let mut deadline = now.plus_secs(policy.reset_secs);
    let phase = if drain.enabled {
        deadline = deadline.plus_secs(drain.timeout_secs);
        effects.push(Effect::Drain {
            run: run.map(|r| OpRun {
                deadline,
                ..r.clone()
            }),
            holder: match run {
                Some(run) => holder_for_operation(&run.op.uid),
                None => HOLDER_DELETION.to_string(),
            },
            policy: drain.clone(),
            until: now.plus_secs(drain.timeout_secs),
        });
        ResetPhase::Draining
    } else {
        effects.extend(wipe());
        ResetPhase::Wiping
    };
    Step::to(
        NodeState::Resetting {
            node,
            run: run.map(|r| OpRun {
                deadline,
                ..r.clone()
            }),
            cause,
            phase,
            deadline,
        },
        effects,
    )
}

/// The wipe, and then the drain's cordon lifted: the Node has no kubelet any more (its
/// not-ready taint keeps pods away), and a node joined again must not start cordoned.
fn wipe() -> [Effect; 2] {
    [Effect::WipeNode, Effect::Uncordon]
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

/// The phase's effects are done: publish the operation's result, then uninstall, then rest.
pub(super) fn effects_done(
    node: &NodeInfo,
    run: Option<&OpRun>,
    cause: ResetCause,
    phase: &ResetPhase,
    policy: &Policy,
    now: Timestamp,
) -> Step {
    match (phase, run) {
        // No progress report first: an API server away would fail the wipe's step.
        (ResetPhase::Draining, _) => {
            let deadline = now.plus_secs(policy.reset_secs);
            Step::to(
                NodeState::Resetting {
                    node: node.clone(),
                    run: run.map(|r| OpRun {
                        deadline,
                        ..r.clone()
                    }),
                    cause,
                    phase: ResetPhase::Wiping,
                    deadline,
                },
                wipe().to_vec(),
            )
        }
        (ResetPhase::Wiping, Some(run)) => {
            let result = op_result(run, ResultReason::Succeeded, MSG_RESET_DONE);
            Step::to(
                NodeState::Resetting {
                    node: node.finishing(&run.op.uid),
                    run: Some(OpRun {
                        deadline: now.plus_secs(policy.publish_secs),
                        ..run.clone()
                    }),
                    cause,
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
        (ResetPhase::Wiping | ResetPhase::Publishing, _) | (ResetPhase::Uninstalling, Some(_)) => {
            uninstall(node, cause, policy, now)
        }
        (ResetPhase::Uninstalling, None) => Step::to(
            NodeState::Unjoined {
                finished: node.finished.clone(),
            },
            Vec::new(),
        ),
    }
}

/// An effect failed, or a tick came: fail the wipe, keep trying to publish (at each tick,
/// until the deadline), or go on uninstalling.
pub(super) fn failed_or_due(
    state: &NodeState,
    r: Resetting<'_>,
    input: &Input,
    policy: &Policy,
    now: Timestamp,
) -> Step {
    // The result not published yet: a failed attempt waits for the next tick, and each tick
    // tries again until the deadline (the API server may be away for minutes; attempts made
    // at once would all meet the same outage). Then the node uninstalls anyway: the result
    // stays in the store and is re-published by a later daemon.
    if let (ResetPhase::Publishing, Some(run)) = (r.phase, r.run)
        && now < r.deadline
    {
        return if matches!(input, Input::Tick) {
            Step::to(
                state.clone(),
                vec![Effect::AwaitPublished { op: run.op.clone() }],
            )
        } else {
            Step::stay(state)
        };
    }
    let message = match input {
        Input::EffectsFailed { message } => Some(message.as_str()),
        // Only the wait for publication is bounded by the deadline: the wipe and the uninstall
        // are never given up half done (a process that finds them interrupted finishes them).
        Input::Tick if now >= r.deadline && *r.phase == ResetPhase::Publishing => {
            Some("reset timed out")
        }
        Input::Tick
        | Input::Join(_)
        | Input::OperationClaimed(_)
        | Input::GoalObserved(_)
        | Input::EffectsDone
        | Input::DaemonStarted { .. }
        | Input::RecoveryRequested { .. }
        | Input::ResetRequested => None,
    };
    let Some(message) = message else {
        return Step::stay(state);
    };
    let node = r.node;
    match (r.phase, r.run) {
        (ResetPhase::Draining | ResetPhase::Wiping, Some(run)) => {
            let mut step = finish(node, run, ResultReason::ExecutionFailed, message);
            step.effects.insert(0, Effect::Uncordon);
            step
        }
        (ResetPhase::Draining | ResetPhase::Wiping, None) => Step::to(
            NodeState::Ready { node: node.clone() },
            vec![
                Effect::Uncordon,
                machine_report(
                    MachinePhase::Failed,
                    &format!("{} failed: {message}", r.cause),
                    None,
                ),
            ],
        ),
        (ResetPhase::Publishing, _) => uninstall(node, r.cause, policy, now),
        (ResetPhase::Uninstalling, _) => Step::to(
            NodeState::Unjoined {
                finished: node.finished.clone(),
            },
            Vec::new(),
        ),
    }
}
