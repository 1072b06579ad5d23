//! A claimed operation on a resting node: what each kind starts.

use super::{MSG_ALREADY_RUNNING, Step, finish};
use crate::lifecycle::agent::{AgentBuild, Slot, UpgradeTarget};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::{Claim, ClaimKind};
use crate::lifecycle::policy::Policy;
use crate::lifecycle::refusal::Refusal;
use crate::lifecycle::result::ResultReason;
use crate::lifecycle::state::{NodeInfo, NodeState, OpRun, ResetCause, UpgradePhase};
use crate::lifecycle::time::Timestamp;
use crate::lifecycle::validate::validate_upgrade;

pub(super) fn claim_operation(
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
    let progress = |message: String| Effect::ReportProgress {
        op: claim.op.clone(),
        message,
        machine_generation: claim.machine_generation,
        started_at: now,
    };
    Ok(match &claim.kind {
        ClaimKind::NodeReboot { parameters } => match policy.drain.with_parameters(parameters) {
            Err(invalid) => finish(
                node,
                &run(0),
                ResultReason::InvalidParameters,
                invalid.message(),
            ),
            Ok(drain) => super::reboot::start(node, run(policy.reboot_secs), drain, now),
        },
        ClaimKind::AgentReset { parameters } => match policy.drain.with_parameters(parameters) {
            Err(invalid) => finish(
                node,
                &run(0),
                ResultReason::InvalidParameters,
                invalid.message(),
            ),
            Ok(drain) => {
                let started = run(policy.reset_secs);
                let mut step = super::reset::reset(
                    node,
                    Some(&started),
                    ResetCause::Operation,
                    None,
                    policy,
                    &drain,
                    now,
                );
                let message = if drain.enabled {
                    "draining the node before resetting its nspawn node runtime"
                } else {
                    "resetting local nspawn node runtime"
                };
                step.effects.insert(0, progress(message.into()));
                step
            }
        },
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
                    // An image that already runs needs no stage, switch or restart; its
                    // switch and its undo would be one and the same disruption.
                    if candidate == node.agent {
                        return Ok(finish(
                            node,
                            &run(0),
                            ResultReason::Succeeded,
                            MSG_ALREADY_RUNNING,
                        ));
                    }
                    Step::to(
                        NodeState::Upgrading {
                            node: node.clone(),
                            run: run(policy.stage_secs),
                            target: target.clone(),
                            candidate: candidate.clone(),
                            phase: UpgradePhase::Staging,
                        },
                        vec![
                            progress("staging upgraded agent".into()),
                            Effect::StageAgent { target, candidate },
                        ],
                    )
                }
            }
        }
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
