//! NodeReboot: drain the Node (unless the policy or the operation says not to), restart the
//! active machine, wait for its kubelet, lift the drain's cordon.

use super::{At, MSG_REBOOT_DONE, Step, busy, finish, machine_report, refuse_claim};
use crate::lifecycle::drain::{DrainPolicy, holder_for_operation};
use crate::lifecycle::effect::Effect;
use crate::lifecycle::input::Input;
use crate::lifecycle::refusal::Refusal;
use crate::lifecycle::result::{MachinePhase, ResultReason};
use crate::lifecycle::state::{NodeInfo, NodeState, OpRun, RebootPhase};
use crate::lifecycle::time::Timestamp;

/// The claim's step: `run` is the operation, its deadline not yet counting the drain.
pub(super) fn start(node: &NodeInfo, run: OpRun, drain: DrainPolicy, now: Timestamp) -> Step {
    let rebooting = |run: OpRun, phase| NodeState::Rebooting {
        node: node.clone(),
        run,
        phase,
    };
    let announce = machine_report(
        MachinePhase::Rebooting,
        &format!("{} restarts its nspawn machine", run.op.name),
        Some(node.applied.generation),
    );
    if !drain.enabled {
        let mut effects = vec![
            progress(
                &run,
                &format!("restarting active nspawn machine {}", node.active.name()),
            ),
            announce,
        ];
        effects.extend(restart(node, now));
        return Step::to(rebooting(run, RebootPhase::Restarting), effects);
    }
    let run = OpRun {
        deadline: run.deadline.plus_secs(drain.timeout_secs),
        ..run
    };
    let effects = vec![
        progress(
            &run,
            &format!(
                "draining the node before restarting nspawn machine {}",
                node.active.name()
            ),
        ),
        announce,
        Effect::Drain {
            run: Some(run.clone()),
            holder: holder_for_operation(&run.op.uid),
            until: now.plus_secs(drain.timeout_secs),
            policy: drain,
        },
    ];
    Step::to(rebooting(run, RebootPhase::Draining), effects)
}

fn progress(run: &OpRun, message: &str) -> Effect {
    Effect::ReportProgress {
        op: run.op.clone(),
        message: message.to_string(),
        machine_generation: run.machine_generation,
        started_at: run.started_at,
    }
}

/// The restart itself. After a drain no progress report comes first: an API server away
/// then would fail the step, and the drain's last report said it was done.
fn restart(node: &NodeInfo, now: Timestamp) -> [Effect; 2] {
    [
        Effect::RestartMachine {
            side: node.active,
            not_before: now,
        },
        Effect::AwaitNode { side: node.active },
    ]
}

pub(super) fn rebooting(
    at: &At,
    node: &NodeInfo,
    run: &OpRun,
    phase: RebootPhase,
    input: &Input,
) -> Result<Step, Refusal> {
    use Input as I;
    use ResultReason as R;
    match input {
        I::EffectsDone => Ok(match phase {
            RebootPhase::Draining => Step::to(
                NodeState::Rebooting {
                    node: node.clone(),
                    run: run.clone(),
                    phase: RebootPhase::Restarting,
                },
                restart(node, at.now).to_vec(),
            ),
            RebootPhase::Restarting => finish_reboot(node, run, R::Succeeded, MSG_REBOOT_DONE),
        }),
        I::EffectsFailed { message } => Ok(finish_reboot(node, run, R::ExecutionFailed, message)),
        I::Tick if at.now >= run.deadline => Ok(finish_reboot(
            node,
            run,
            R::ExecutionFailed,
            "NodeReboot timed out",
        )),
        I::Tick | I::DaemonStarted { .. } => Ok(at.stay()),
        I::ResetRequested => Ok(at.reset(node, Some(run))),
        I::Join(_) => Err(Refusal::AlreadyJoined),
        I::OperationClaimed(claim) => Err(refuse_claim(at.state, Some(run), claim)),
        I::GoalObserved(_) => Err(busy(at.state)),
        I::RecoveryRequested { .. } => Err(Refusal::NoUpgradePending),
    }
}

/// A reboot's end also ends the Machine's `Rebooting`: its phase is `Ready` again, and its
/// applied settings version unchanged. The drain's cordon is lifted before the result is
/// published, so whoever waits for the result (a rollout) finds the Node schedulable.
fn finish_reboot(node: &NodeInfo, run: &OpRun, reason: ResultReason, message: &str) -> Step {
    let mut step = finish(node, run, reason, message);
    step.effects.insert(0, Effect::Uncordon);
    step.effects.push(machine_report(
        MachinePhase::Ready,
        &format!("{} is over: {message}", run.op.name),
        Some(node.applied.generation),
    ));
    step
}
