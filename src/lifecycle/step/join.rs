//! Join: the node's first install, and what ends it.

use super::{Step, machine_report};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::JoinRequest;
use crate::lifecycle::policy::Policy;
use crate::lifecycle::result::MachinePhase;
use crate::lifecycle::state::{FinishedOps, JoinPhase, NodeInfo, NodeState, Side};
use crate::lifecycle::time::Timestamp;

pub(super) fn join(
    finished: &FinishedOps,
    req: &JoinRequest,
    policy: &Policy,
    now: Timestamp,
) -> Step {
    let node = NodeInfo {
        name: req.node_name.clone(),
        mode: req.mode,
        arch: req.arch,
        active: Side::Kube1,
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
            Effect::DisableSwap,
            Effect::ProvisionMachine {
                side: node.active,
                goal: req.goal.clone(),
            },
            Effect::StartMachine { side: node.active },
            Effect::AwaitNode { side: node.active },
        ],
    )
}

/// Installing done: start the agent; starting done: the node is ready.
pub(super) fn effects_done(node: &NodeInfo, phase: JoinPhase, deadline: Timestamp) -> Step {
    match phase {
        JoinPhase::Installing => Step::to(
            NodeState::Joining {
                node: node.clone(),
                phase: JoinPhase::Starting,
                deadline,
            },
            vec![Effect::StartAgent],
        ),
        JoinPhase::Starting => Step::to(
            NodeState::Ready { node: node.clone() },
            vec![machine_report(
                MachinePhase::Ready,
                "node joined",
                Some(node.applied.generation),
            )],
        ),
    }
}

pub(super) fn join_failed(node: &NodeInfo, message: &str) -> Step {
    Step::to(
        NodeState::Unjoined {
            finished: node.finished.clone(),
        },
        vec![machine_report(MachinePhase::Failed, message, None)],
    )
}
