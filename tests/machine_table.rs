//! One table test per transition of the pure core.

use flexnode::machine::effect::{MachinePhase, ResultReason};
use flexnode::machine::input::{
    Claim, ClaimKind, GoalObservation, JoinRequest, MachineObservation, NodeObservation,
};
use flexnode::machine::policy::Policy;
use flexnode::machine::state::{
    AgentBuild, Goal, InstallMode, OpRef, RepavePhase, ResetCause, ResetPhase, Side, Slot,
    UpgradePhase,
};
use flexnode::machine::validate::{Arch, Sha256Hex};
use flexnode::machine::{Effect, Input, NodeState, Refusal, Timestamp, step};
use std::collections::BTreeMap;

const T0: Timestamp = Timestamp::from_millis(1_785_578_400_000);
const D1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn digest(h: &str) -> Sha256Hex {
    Sha256Hex::parse(h).expect("valid digest")
}
fn blue() -> AgentBuild {
    AgentBuild::Slot { slot: Slot::Blue }
}
fn green() -> AgentBuild {
    AgentBuild::Slot { slot: Slot::Green }
}
fn image(h: &str) -> AgentBuild {
    AgentBuild::Image { digest: digest(h) }
}
fn goal(generation: i64) -> Goal {
    Goal {
        generation,
        kubernetes_version: format!("v1.34.{generation}"),
    }
}
fn op(uid: &str) -> OpRef {
    OpRef {
        name: format!("op-{uid}"),
        uid: uid.into(),
    }
}
fn claim(uid: &str, kind: ClaimKind) -> Input {
    Input::OperationClaimed(Claim {
        op: op(uid),
        kind,
        machine_generation: 3,
    })
}
fn upgrade(url: &str, sha: &str) -> ClaimKind {
    ClaimKind::AgentUpgrade {
        parameters: BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), sha.to_string()),
        ]),
    }
}
fn failed(msg: &str) -> Input {
    Input::EffectsFailed {
        message: msg.into(),
    }
}
fn started(build: AgentBuild) -> Input {
    Input::DaemonStarted { running: build }
}

/// Applies inputs at `T0`, returning the final state and each step's effects.
fn run(state: &NodeState, inputs: &[Input]) -> (NodeState, Vec<Vec<Effect>>) {
    run_at(state, inputs, T0)
}

fn run_at(state: &NodeState, inputs: &[Input], now: Timestamp) -> (NodeState, Vec<Vec<Effect>>) {
    let mut s = state.clone();
    let mut all = Vec::new();
    for i in inputs {
        let st = step(&s, i, &Policy::default(), now)
            .unwrap_or_else(|r| panic!("{i} refused in {s}: {r}"));
        s = st.next;
        all.push(st.effects);
    }
    (s, all)
}

fn refused(state: &NodeState, input: &Input) -> Refusal {
    match step(state, input, &Policy::default(), T0) {
        Err(r) => r,
        Ok(s) => panic!("{input} accepted in {state}: {:?}", s.next),
    }
}

fn joined(mode: InstallMode) -> NodeState {
    let agent = match mode {
        InstallMode::Host => blue(),
        InstallMode::Container => image(D1),
    };
    let join = Input::Join(JoinRequest {
        node_name: "edge-07".into(),
        mode,
        arch: Arch::Amd64,
        goal: goal(1),
        agent,
    });
    run(
        &NodeState::default(),
        &[join, Input::EffectsDone, Input::EffectsDone],
    )
    .0
}

fn published(effects: &[Effect]) -> Option<(ResultReason, String)> {
    effects.iter().find_map(|e| match e {
        Effect::PublishResult { result, .. } => Some((result.reason, result.message.clone())),
        _ => None,
    })
}

fn names(effects: &[Effect]) -> Vec<&'static str> {
    effects.iter().map(Effect::name).collect()
}

#[test]
fn join_installs_starts_and_reports_ready() {
    let join = Input::Join(JoinRequest {
        node_name: "edge-07".into(),
        mode: InstallMode::Host,
        arch: Arch::Amd64,
        goal: goal(1),
        agent: blue(),
    });
    let (s, effects) = run(&NodeState::default(), std::slice::from_ref(&join));
    assert!(matches!(s, NodeState::Joining { .. }));
    assert_eq!(
        names(&effects[0]),
        [
            "ReportMachine",
            "InstallAgent",
            "WriteUnits",
            "ProvisionMachine",
            "StartMachine"
        ]
    );
    let (s, effects) = run(&s, &[Input::EffectsDone]);
    assert_eq!(names(&effects[0]), ["StartAgent"]);
    let (s, effects) = run(&s, &[Input::EffectsDone]);
    let NodeState::Ready { node } = &s else {
        panic!("not ready: {s}")
    };
    assert_eq!(node.active, Side::Kube1);
    assert_eq!(node.agent, blue());
    assert!(matches!(
        effects[0][..],
        [Effect::ReportMachine {
            phase: MachinePhase::Ready,
            observed_generation: Some(1),
            ..
        }]
    ));
    assert_eq!(refused(&s, &join), Refusal::AlreadyJoined);
}

#[test]
fn join_failure_and_timeout_return_to_unjoined() {
    let join = Input::Join(JoinRequest {
        node_name: "n".into(),
        mode: InstallMode::Host,
        arch: Arch::Amd64,
        goal: goal(1),
        agent: blue(),
    });
    let (s, _) = run(&NodeState::default(), &[join.clone(), failed("disk full")]);
    assert!(matches!(s, NodeState::Unjoined { .. }));
    let (s, _) = run(&NodeState::default(), &[join]);
    let (s, e) = run_at(&s, &[Input::Tick], T0.plus_secs(1801));
    assert!(matches!(s, NodeState::Unjoined { .. }));
    assert!(matches!(
        e[0][..],
        [Effect::ReportMachine {
            phase: MachinePhase::Failed,
            ..
        }]
    ));
}

#[test]
fn unjoined_refuses_everything_but_join() {
    let s = NodeState::default();
    assert_eq!(
        refused(&s, &claim("a", ClaimKind::NodeReboot)),
        Refusal::NotJoined
    );
    assert_eq!(refused(&s, &Input::ResetRequested), Refusal::NotJoined);
    assert!(matches!(
        refused(&s, &Input::EffectsDone),
        Refusal::NothingPending { .. }
    ));
}

#[test]
fn node_reboot_restarts_active_side_and_completes() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(&ready, &[claim("r1", ClaimKind::NodeReboot)]);
    assert!(matches!(s, NodeState::Rebooting { .. }));
    assert_eq!(
        e[0][1],
        Effect::RestartMachine {
            side: Side::Kube1,
            not_before: T0
        }
    );
    assert_eq!(
        refused(&s, &claim("r1", ClaimKind::NodeReboot)),
        Refusal::AlreadyRunning { op: op("r1") }
    );
    assert!(matches!(
        refused(&s, &claim("r2", ClaimKind::NodeReboot)),
        Refusal::Busy { .. }
    ));
    let (done, e) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(done, NodeState::Ready { .. }));
    assert_eq!(
        published(&e[0]),
        Some((ResultReason::Succeeded, "NodeReboot completed".into()))
    );
    assert_eq!(
        refused(&done, &claim("r1", ClaimKind::NodeReboot)),
        Refusal::AlreadyFinished { op: op("r1") }
    );
}

#[test]
fn node_reboot_failure_and_deadline_publish_execution_failed() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(&ready, &[claim("r1", ClaimKind::NodeReboot)]);
    let (_, e) = run(&s, &[failed("machine kube1 did not start")]);
    assert_eq!(
        published(&e[0]),
        Some((
            ResultReason::ExecutionFailed,
            "machine kube1 did not start".into()
        ))
    );
    let (same, e) = run_at(&s, &[Input::Tick], T0.plus_secs(10));
    assert_eq!(same, s);
    assert!(e[0].is_empty());
    let (_, e) = run_at(&s, &[Input::Tick], T0.plus_secs(601));
    assert_eq!(
        published(&e[0]),
        Some((ResultReason::ExecutionFailed, "NodeReboot timed out".into()))
    );
}

#[test]
fn unsupported_kind_fails_with_unsupported_operation() {
    let ready = joined(InstallMode::Host);
    let kind = ClaimKind::Unsupported {
        kind: "HostPowerOff".into(),
    };
    let (s, e) = run(&ready, &[claim("h", kind)]);
    assert!(matches!(s, NodeState::Ready { .. }));
    let (reason, msg) = published(&e[0]).expect("result");
    assert_eq!(reason, ResultReason::UnsupportedOperation);
    assert!(msg.contains("HostPowerOff"));
}

#[test]
fn host_upgrade_stages_switches_hands_off_and_succeeds() {
    let ready = joined(InstallMode::Host);
    let up = claim("u1", upgrade("https://a.example/f.tgz?sig=x", D2));
    let (s, e) = run(&ready, &[up]);
    let NodeState::Upgrading {
        candidate, phase, ..
    } = &s
    else {
        panic!("{s}")
    };
    assert_eq!(*candidate, green());
    assert_eq!(*phase, UpgradePhase::Staging);
    assert_eq!(names(&e[0]), ["ReportProgress", "StageAgent"]);
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(
        e[0],
        [Effect::SwitchAgent {
            mode: InstallMode::Host,
            to: green(),
            last_good: blue()
        }]
    );
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(e[0][..], [Effect::ScheduleAgentRestart { .. }]));
    assert!(!s.awaits_effects(), "a hand-off waits for the successor");
    // The restart-scheduling outcome arrives; still waiting for the successor.
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert!(e[0].is_empty());
    assert!(matches!(
        refused(&s, &claim("u2", upgrade("https://a.example/g.tgz", D1))),
        Refusal::Busy { .. }
    ));
    let (done, e) = run(&s, &[started(green())]);
    let NodeState::Ready { node } = &done else {
        panic!("{done}")
    };
    assert_eq!(node.agent, green());
    assert_eq!(node.last_good, Some(blue()));
    assert_eq!(
        published(&e[0]),
        Some((ResultReason::Succeeded, "AgentUpgrade completed".into()))
    );
}

#[test]
fn container_upgrade_targets_the_image_digest() {
    let ready = joined(InstallMode::Container);
    let (s, _) = run(
        &ready,
        &[claim(
            "u1",
            upgrade("oci://registry.example/flexnode:v2", D2),
        )],
    );
    let NodeState::Upgrading { candidate, .. } = &s else {
        panic!("{s}")
    };
    assert_eq!(*candidate, image(D2));
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(
        e[0],
        [Effect::SwitchAgent {
            mode: InstallMode::Container,
            to: image(D2),
            last_good: image(D1)
        }]
    );
    let (s, _) = run(&s, &[Input::EffectsDone]);
    let (done, e) = run(&s, &[started(image(D2))]);
    assert_eq!(done.node().map(|n| n.agent.clone()), Some(image(D2)));
    assert_eq!(published(&e[0]).map(|p| p.0), Some(ResultReason::Succeeded));
}

#[test]
fn invalid_upgrade_parameters_publish_invalid_parameters_and_run_nothing() {
    let ready = joined(InstallMode::Host);
    for (url, sha) in [
        ("https://a.example/f.tgz", ""),
        ("https://a.example/f.tgz", "abc"),
        ("oci://r.example/f:1", D2),
        ("https://user:pw@a.example/f.tgz", D2),
    ] {
        let (s, e) = run(&ready, &[claim("bad", upgrade(url, sha))]);
        assert!(matches!(s, NodeState::Ready { .. }));
        assert_eq!(e[0].len(), 1, "only the result: {:?}", e[0]);
        assert_eq!(
            published(&e[0]).map(|p| p.0),
            Some(ResultReason::InvalidParameters)
        );
        assert!(
            !published(&e[0])
                .map(|p| p.1)
                .unwrap_or_default()
                .contains("pw")
        );
    }
    let container = joined(InstallMode::Container);
    let (_, e) = run(
        &container,
        &[claim("bad", upgrade("https://a.example/f.tgz", D2))],
    );
    assert_eq!(
        published(&e[0]).map(|p| p.0),
        Some(ResultReason::InvalidParameters)
    );
}

#[test]
fn stage_failure_aborts_and_publishes_execution_failed() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            failed("sha256 mismatch"),
        ],
    );
    assert!(matches!(
        s,
        NodeState::Upgrading {
            phase: UpgradePhase::RollingBack { restart: false, .. },
            ..
        }
    ));
    let (done, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(done.node().map(|n| n.agent.clone()), Some(blue()));
    assert_eq!(
        published(&e[0]),
        Some((ResultReason::ExecutionFailed, "sha256 mismatch".into()))
    );
}

#[test]
fn switch_failure_switches_back() {
    let ready = joined(InstallMode::Host);
    let (_, e) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            failed("rename failed"),
        ],
    );
    assert_eq!(
        e[2],
        [Effect::SwitchAgent {
            mode: InstallMode::Host,
            to: blue(),
            last_good: blue()
        }]
    );
}

#[test]
fn restart_scheduling_failure_rolls_back_with_fixed_message() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            Input::EffectsDone,
            failed("dbus"),
        ],
    );
    let (_, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(
        published(&e[0]),
        Some((
            ResultReason::ExecutionFailed,
            "failed to restart upgraded agent daemon".into()
        ))
    );
}

#[test]
fn handoff_deadline_without_successor_rolls_back() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            Input::EffectsDone,
        ],
    );
    let (s, e) = run_at(&s, &[Input::Tick], T0.plus_secs(301));
    assert!(matches!(e[0][..], [Effect::SwitchAgent { .. }]));
    let (done, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(done.node().map(|n| n.agent.clone()), Some(blue()));
    assert_eq!(
        published(&e[0]).map(|p| p.0),
        Some(ResultReason::ExecutionFailed)
    );
}

#[test]
fn crash_looping_candidate_goes_through_recovery_and_last_good_publishes_daemon_failed() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            Input::EffectsDone,
        ],
    );
    let recover = Input::RecoveryRequested {
        message: "upgraded daemon failed repeatedly; restored last-good agent".into(),
    };
    let (s, e) = run(&s, std::slice::from_ref(&recover));
    assert_eq!(names(&e[0]), ["SwitchAgent", "RestartAgent"]);
    assert_eq!(refused(&s, &recover), Refusal::NoUpgradePending);
    let (done, e) = run(&s, &[started(blue())]);
    assert_eq!(done.node().map(|n| n.agent.clone()), Some(blue()));
    assert_eq!(
        published(&e[0]),
        Some((
            ResultReason::DaemonFailed,
            "upgraded daemon failed repeatedly; restored last-good agent".into()
        ))
    );
    // A plain crash later never swaps binaries.
    assert_eq!(refused(&done, &recover), Refusal::NoUpgradePending);
}

#[test]
fn successor_that_is_not_the_candidate_means_daemon_failed() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            Input::EffectsDone,
        ],
    );
    let (_, e) = run(&s, &[started(blue())]);
    assert_eq!(
        published(&e[0]).map(|p| p.0),
        Some(ResultReason::DaemonFailed)
    );
}

#[test]
fn failed_abort_restarts_and_the_next_daemon_reports() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(
        &ready,
        &[
            claim("u1", upgrade("https://a.example/f.tgz", D2)),
            Input::EffectsDone,
            failed("switch failed"),
            failed("switch back failed"),
        ],
    );
    assert_eq!(e[3], [Effect::RestartAgent]);
    let (done, e) = run(&s, &[started(green())]);
    assert_eq!(done.node().map(|n| n.agent.clone()), Some(green()));
    let (reason, msg) = published(&e[0]).expect("result");
    assert_eq!(reason, ResultReason::ExecutionFailed);
    assert!(msg.contains("rollback failed"), "{msg}");
}

#[test]
fn agent_reset_wipes_publishes_then_uninstalls() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(&ready, &[claim("x1", ClaimKind::AgentReset)]);
    assert_eq!(names(&e[0]), ["ReportProgress", "WipeNode"]);
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(
        s,
        NodeState::Resetting {
            phase: ResetPhase::Publishing,
            ..
        }
    ));
    assert_eq!(names(&e[0]), ["PublishResult", "AwaitPublished"]);
    assert_eq!(published(&e[0]).map(|p| p.0), Some(ResultReason::Succeeded));
    // The API server is away: keep trying until the deadline, then uninstall anyway.
    let (s2, e) = run(&s, &[failed("connection refused")]);
    assert_eq!(names(&e[0]), ["AwaitPublished"]);
    let (s3, e) = run_at(&s2, &[failed("connection refused")], T0.plus_secs(121));
    assert_eq!(names(&e[0]), ["UninstallAgent"]);
    let (end, _) = run(&s3, &[Input::EffectsDone]);
    assert!(matches!(end, NodeState::Unjoined { .. }));
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(names(&e[0]), ["UninstallAgent"]);
    let (end, _) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(end, NodeState::Unjoined { .. }));
    assert!(matches!(
        refused(&end, &claim("x1", ClaimKind::AgentReset)),
        Refusal::NotJoined
    ));
}

#[test]
fn agent_reset_failure_publishes_and_keeps_the_daemon() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(
        &ready,
        &[claim("x1", ClaimKind::AgentReset), failed("umount busy")],
    );
    assert!(matches!(s, NodeState::Ready { .. }));
    assert_eq!(
        published(&e[1]).map(|p| p.0),
        Some(ResultReason::ExecutionFailed)
    );
}

#[test]
fn cli_reset_interrupting_an_operation_publishes_its_result_first() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(&ready, &[claim("r1", ClaimKind::NodeReboot)]);
    let (s, e) = run(&s, &[Input::ResetRequested]);
    assert_eq!(names(&e[0]), ["PublishResult", "WipeNode"]);
    assert_eq!(
        published(&e[0]),
        Some((
            ResultReason::ExecutionFailed,
            "interrupted by a node reset".into()
        ))
    );
    assert_eq!(refused(&s, &Input::ResetRequested), Refusal::ResetUnderWay);
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(names(&e[0]), ["UninstallAgent"]);
    let (end, _) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(end, NodeState::Unjoined { .. }));
}

fn observe(node: NodeObservation, machine: MachineObservation) -> Input {
    Input::GoalObserved(GoalObservation { node, machine })
}

#[test]
fn deletion_signal_resets_without_an_operation() {
    let ready = joined(InstallMode::Host);
    let taint = NodeObservation::Present {
        deletion_taint: true,
    };
    let (s, _) = run(
        &ready,
        &[observe(taint, MachineObservation::Present(goal(1)))],
    );
    assert_eq!(s, ready, "taint alone waits for the Machine to go");
    let (s, _) = run(
        &ready,
        &[observe(
            NodeObservation::Absent,
            MachineObservation::Missing,
        )],
    );
    assert_eq!(s, ready, "a 404 alone never wipes");
    let (s, e) = run(&ready, &[observe(taint, MachineObservation::Missing)]);
    assert!(matches!(
        s,
        NodeState::Resetting {
            cause: ResetCause::DeletionSignal,
            ..
        }
    ));
    assert_eq!(names(&e[0]), ["WipeNode"]);
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(names(&e[0]), ["UninstallAgent"]);
    let (end, _) = run(&s, &[Input::EffectsDone]);
    assert!(matches!(end, NodeState::Unjoined { .. }));
}

#[test]
fn repave_provisions_switches_over_and_retires() {
    let ready = joined(InstallMode::Host);
    let present = NodeObservation::Present {
        deletion_taint: false,
    };
    let (s, _) = run(
        &ready,
        &[observe(present, MachineObservation::Present(goal(2)))],
    );
    assert_eq!(s, ready, "a changed goal waits for the Node to go");
    let (s, e) = run(
        &ready,
        &[observe(
            NodeObservation::Absent,
            MachineObservation::Present(goal(2)),
        )],
    );
    assert_eq!(names(&e[0]), ["ReportMachine", "ProvisionMachine"]);
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(
        e[0],
        [
            Effect::StopMachine { side: Side::Kube1 },
            Effect::StartMachine { side: Side::Kube2 }
        ]
    );
    let (s, e) = run(&s, &[Input::EffectsDone]);
    assert_eq!(e[0], [Effect::RemoveMachine { side: Side::Kube1 }]);
    let (done, e) = run(&s, &[Input::EffectsDone]);
    let node = done.node().expect("node");
    assert_eq!(node.active, Side::Kube2);
    assert_eq!(node.applied, goal(2));
    assert_eq!(node.previous, Some(goal(1)));
    assert!(matches!(
        e[0][..],
        [Effect::ReportMachine {
            phase: MachinePhase::Ready,
            observed_generation: Some(2),
            ..
        }]
    ));
}

#[test]
fn repave_new_side_failure_after_old_stopped_rolls_back_automatically() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            observe(
                NodeObservation::Absent,
                MachineObservation::Present(goal(2)),
            ),
            Input::EffectsDone,
        ],
    );
    let (s, e) = run(&s, &[failed("kubelet not ready on kube2")]);
    assert!(matches!(
        s,
        NodeState::Repaving {
            phase: RepavePhase::RollingBack { .. },
            ..
        }
    ));
    assert_eq!(
        e[0],
        [
            Effect::StopMachine { side: Side::Kube2 },
            Effect::StartMachine { side: Side::Kube1 }
        ]
    );
    let (done, e) = run(&s, &[Input::EffectsDone]);
    let node = done.node().expect("node");
    assert_eq!(node.active, Side::Kube1);
    assert_eq!(node.applied, goal(1));
    assert!(matches!(
        &e[0][..],
        [Effect::ReportMachine { phase: MachinePhase::Failed, message, .. }] if message.contains("rolled back")
    ));
}

#[test]
fn repave_provisioning_failure_keeps_old_side_running() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(
        &ready,
        &[
            observe(
                NodeObservation::Absent,
                MachineObservation::Present(goal(2)),
            ),
            failed("pull failed"),
        ],
    );
    assert_eq!(s.node().map(|n| n.active), Some(Side::Kube1));
    assert!(!e[1].iter().any(|e| matches!(e, Effect::StopMachine { .. })));
    assert_eq!(e[1][0], Effect::RemoveMachine { side: Side::Kube2 });
}

#[test]
fn repave_deadline_during_switch_over_rolls_back() {
    let ready = joined(InstallMode::Host);
    let (s, _) = run(
        &ready,
        &[
            observe(
                NodeObservation::Absent,
                MachineObservation::Present(goal(2)),
            ),
            Input::EffectsDone,
        ],
    );
    let (s, _) = run_at(&s, &[Input::Tick], T0.plus_secs(1801));
    assert!(matches!(
        s,
        NodeState::Repaving {
            phase: RepavePhase::RollingBack { .. },
            ..
        }
    ));
}

#[test]
fn ready_records_the_build_that_actually_runs() {
    let ready = joined(InstallMode::Host);
    let (s, e) = run(&ready, &[started(green())]);
    assert_eq!(s.node().map(|n| n.agent.clone()), Some(green()));
    assert!(e[0].is_empty());
}
