//! Repave: the Machine's goal changed while the Node is gone — build the other side, switch
//! over, retire the old one; a failure after the old side stopped brings it back.

use super::{Step, machine_report};
use crate::lifecycle::drain::holder_for_repave;
use crate::lifecycle::effect::Effect;
use crate::lifecycle::policy::Policy;
use crate::lifecycle::result::MachinePhase;
use crate::lifecycle::state::{Goal, NodeInfo, NodeState, RepavePhase};
use crate::lifecycle::time::Timestamp;

/// Provision the other side while the active one keeps running.
pub(super) fn start(node: &NodeInfo, goal: Goal, policy: &Policy, now: Timestamp) -> Step {
    let drain = if policy.drain.enabled {
        policy.drain.timeout_secs
    } else {
        0
    };
    Step::to(
        NodeState::Repaving {
            node: node.clone(),
            goal: goal.clone(),
            phase: RepavePhase::Provisioning,
            deadline: now.plus_secs(policy.repave_secs + drain),
        },
        vec![
            machine_report(
                MachinePhase::Provisioning,
                &format!("repaving to {}", node.active.other().name()),
                None,
            ),
            Effect::ProvisionMachine {
                side: node.active.other(),
                goal,
            },
        ],
    )
}

/// The repave's state in `phase`.
fn repaving(node: &NodeInfo, goal: &Goal, phase: RepavePhase, deadline: Timestamp) -> NodeState {
    NodeState::Repaving {
        node: node.clone(),
        goal: goal.clone(),
        phase,
        deadline,
    }
}

pub(super) fn effects_done(
    node: &NodeInfo,
    goal: &Goal,
    phase: &RepavePhase,
    deadline: Timestamp,
    policy: &Policy,
    now: Timestamp,
) -> Step {
    let from = node.active;
    let to = from.other();
    match phase {
        // The old side's pods evicted before it stops. With the anchor's contract the Node is
        // gone already (its owner drained it, as the anchor's RP does): nothing to cordon,
        // and the pods still bound to it are the pod GC's within a minute whatever their
        // budgets say, so the drain evicts what budgets allow and then goes on.
        RepavePhase::Provisioning if policy.drain.enabled => Step::to(
            repaving(node, goal, RepavePhase::Draining, deadline),
            vec![Effect::Drain {
                run: None,
                holder: holder_for_repave(goal.generation),
                policy: policy.drain.going_on(),
                until: now.plus_secs(policy.drain.timeout_secs),
            }],
        ),
        RepavePhase::Provisioning | RepavePhase::Draining => Step::to(
            NodeState::Repaving {
                node: node.clone(),
                goal: goal.clone(),
                phase: RepavePhase::SwitchingOver,
                deadline,
            },
            vec![
                Effect::StopMachine { side: from },
                Effect::StartMachine { side: to },
                Effect::AwaitNode { side: to },
            ],
        ),
        RepavePhase::SwitchingOver => Step::to(
            NodeState::Repaving {
                node: NodeInfo {
                    active: to,
                    previous: Some(node.applied.clone()),
                    applied: goal.clone(),
                    ..node.clone()
                },
                goal: goal.clone(),
                phase: RepavePhase::Retiring,
                deadline,
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
    }
}

pub(super) fn repave_failure(
    node: &NodeInfo,
    goal: &Goal,
    phase: &RepavePhase,
    deadline: Timestamp,
    message: &str,
) -> Step {
    let from = node.active;
    let to = from.other();
    match phase {
        // The old side never stopped: drop the half-built new side.
        RepavePhase::Provisioning | RepavePhase::Draining => {
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
                Effect::AwaitNode { side: from },
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

/// Every end of a repave lifts its drain's cordon.
fn repave_failed(node: &NodeInfo, message: &str) -> Step {
    Step::to(
        NodeState::Ready { node: node.clone() },
        vec![
            Effect::Uncordon,
            machine_report(MachinePhase::Failed, message, None),
        ],
    )
}

fn repave_done(node: &NodeInfo) -> Step {
    Step::to(
        NodeState::Ready { node: node.clone() },
        vec![
            Effect::Uncordon,
            machine_report(
                MachinePhase::Ready,
                "machine goal state applied",
                Some(node.applied.generation),
            ),
        ],
    )
}
