//! The real daemon (watches, claims, status publication, TTL) against a real kube-apiserver,
//! with the simulated host underneath.

use crate::support;

use flexnode::api::Machine;
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::{Build, FaultKind, SimHost};
use flexnode_test_tier::tier;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::Lab;
use support::agent::{Agent, admin, apply_rbac, create_node_and_machine};
use support::logs;

fn v2() -> Build {
    Build {
        version: "0.2.0".into(),
        crashes: false,
    }
}

const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const IMAGE: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const URL: &str = "https://artifacts.example/flexnode-v2.tar.gz?sig=SECRETSAS";

fn spec(machine_ref: Option<&str>, kind: OperationKind) -> MachineOperationSpec {
    MachineOperationSpec {
        machine_ref: machine_ref.map(str::to_string),
        operation_kind: kind,
        ..Default::default()
    }
}

fn upgrade(url: &str, sha: &str) -> MachineOperationSpec {
    MachineOperationSpec {
        parameters: Some(BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), sha.to_string()),
        ])),
        ..spec(None, OperationKind::AgentUpgrade)
    }
}

fn phase(op: &MachineOperation) -> Option<OperationPhase> {
    op.status.as_ref().and_then(|s| s.phase)
}

/// What every daemon test starts from: a lab control plane with the agents' RBAC, an admin
/// client, and nodes joined on demand.
struct Scenario {
    lab: Lab,
    client: Client,
}

impl Scenario {
    async fn up() -> Self {
        let lab = Lab::up();
        apply_rbac(&lab);
        let client = admin(&lab).await;
        Self { lab, client }
    }

    /// A Node and Machine `name` (with `labels`), joined in `mode`, its daemon running.
    async fn node(&self, name: &str, labels: &[(&str, &str)], mode: InstallMode) -> Agent {
        create_node_and_machine(&self.client, name, labels).await;
        Agent::join(&self.lab, name, mode).await
    }

    fn ops(&self) -> Api<MachineOperation> {
        Api::all(self.client.clone())
    }

    async fn create(&self, name: &str, spec: MachineOperationSpec) -> MachineOperation {
        self.ops()
            .create(&PostParams::default(), &MachineOperation::new(name, spec))
            .await
            .expect("create op")
    }

    async fn wait_for(
        &self,
        name: &str,
        secs: u64,
        want: impl Fn(&MachineOperation) -> bool,
    ) -> MachineOperation {
        let api = self.ops();
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Ok(Some(op)) = api.get_opt(name).await {
                if want(&op) {
                    return op;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name} never got there: {:?}",
                    op.status
                );
            } else {
                assert!(Instant::now() < deadline, "{name} missing");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The operation once Complete or Failed, its terminal status checked for consistency:
    /// `startedAt` ≤ `completedAt`, and the Completed condition changed at `completedAt`.
    async fn wait_terminal(&self, name: &str) -> MachineOperation {
        let op = self.wait_for(name, 60, MachineOperation::is_terminal).await;
        let s = op.status.clone().expect("status");
        let completed = s
            .conditions
            .as_ref()
            .and_then(|c| c.iter().find(|c| c.type_ == "Completed"))
            .expect("a Completed condition");
        assert!(s.started_at.is_some(), "{name}: no startedAt");
        assert!(s.started_at <= s.completed_at, "{name}: {s:?}");
        assert_eq!(
            s.completed_at.as_ref(),
            Some(&completed.last_transition_time),
            "{name}: completedAt and the condition's lastTransitionTime differ"
        );
        op
    }
}

fn reason(op: &MachineOperation) -> String {
    op.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Completed"))
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_default()
}

/// How often the simulated host's machines were restarted.
pub(crate) fn machine_restarts(host: &SimHost) -> usize {
    host.world()
        .calls
        .iter()
        .filter(|c| c.starts_with("restart(systemd-nspawn"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn claims_runs_and_publishes_operations() {
    let sc = Scenario::up().await;
    let mut agent = sc
        .node(
            "edge-07",
            &[("unbounded-cloud.io/site", "flex-site")],
            InstallMode::Host,
        )
        .await;

    // NodeReboot addressed by name.
    sc.create("reboot-1", spec(Some("edge-07"), OperationKind::NodeReboot))
        .await;
    let op = sc.wait_terminal("reboot-1").await;
    assert_eq!(phase(&op), Some(OperationPhase::Complete));
    assert_eq!(reason(&op), "True/Succeeded");
    let s = op.status.clone().expect("status");
    assert_eq!(s.message.as_deref(), Some("NodeReboot completed"));
    assert!(s.started_at.is_some() && s.completed_at.is_some());
    assert!(s.started_at <= s.completed_at);
    assert_eq!(s.observed_machine_generation, Some(1));
    assert_eq!(machine_restarts(&agent.host), 1);

    // An Event was recorded for the operation.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(sc.client.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = events.list(&Default::default()).await.expect("events");
        let reasons: Vec<String> = list
            .items
            .iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("reboot-1"))
            .filter_map(|e| e.reason.clone())
            .collect();
        if reasons.contains(&"Succeeded".to_string()) && reasons.contains(&"InProgress".to_string())
        {
            break;
        }
        assert!(Instant::now() < deadline, "events: {reasons:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Another node's operation and another controller's kind are left untouched.
    sc.create(
        "reboot-other",
        spec(Some("edge-99"), OperationKind::NodeReboot),
    )
    .await;
    sc.create(
        "power-off",
        spec(Some("edge-07"), OperationKind::HostPowerOff),
    )
    .await;

    // A selector operation matched by the Node's labels.
    let by_label = MachineOperationSpec {
        machine_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "unbounded-cloud.io/site".to_string(),
                "flex-site".to_string(),
            )])),
            ..Default::default()
        }),
        ..spec(None, OperationKind::NodeReboot)
    };
    sc.create("reboot-by-label", by_label.clone()).await;
    assert_eq!(
        reason(&sc.wait_terminal("reboot-by-label").await),
        "True/Succeeded"
    );
    let not_matching = MachineOperationSpec {
        machine_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "unbounded-cloud.io/site".to_string(),
                "elsewhere".to_string(),
            )])),
            ..Default::default()
        }),
        ..spec(None, OperationKind::NodeReboot)
    };
    sc.create("reboot-elsewhere", not_matching).await;

    // Invalid parameters: InvalidParameters, nothing staged, and no secret in the message.
    let before = agent.host.world().calls.len();
    sc.create(
        "upgrade-bad",
        MachineOperationSpec {
            machine_ref: Some("edge-07".into()),
            ..upgrade("https://user:hunter2@a.example/f.tgz?sig=SECRETSAS", SHA)
        },
    )
    .await;
    let op = sc.wait_terminal("upgrade-bad").await;
    assert_eq!(reason(&op), "False/InvalidParameters");
    let msg = op.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        !msg.contains("hunter2") && !msg.contains("SECRETSAS"),
        "{msg}"
    );
    assert!(
        agent.host.world().calls[before..]
            .iter()
            .all(|c| !c.starts_with("stage")),
        "nothing executed"
    );

    // Deleted and recreated under the same name: a new operation, run again.
    let first = sc.ops().get("reboot-1").await.expect("get");
    sc.ops()
        .delete("reboot-1", &DeleteParams::default())
        .await
        .expect("delete");
    let recreated = sc
        .create("reboot-1", spec(Some("edge-07"), OperationKind::NodeReboot))
        .await;
    assert_ne!(first.metadata.uid, recreated.metadata.uid);
    let op = sc
        .wait_for("reboot-1", 60, |op| {
            op.metadata.uid == recreated.metadata.uid && phase(op) == Some(OperationPhase::Complete)
        })
        .await;
    assert_eq!(reason(&op), "True/Succeeded");
    assert_eq!(
        machine_restarts(&agent.host),
        3,
        "three reboots ran (name, label, recreated)"
    );

    // TTL: deleted once finished for that long.
    let ttl = MachineOperationSpec {
        ttl_seconds_after_finished: Some(1),
        ..spec(Some("edge-07"), OperationKind::NodeReboot)
    };
    sc.create("reboot-ttl", ttl).await;
    // It may finish and be deleted between two polls (only finished operations are deleted):
    // wait for the deletion, then check that it ran.
    let api = sc.ops();
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt("reboot-ttl").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "TTL deletion did not happen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        machine_restarts(&agent.host),
        4,
        "the TTL operation ran first"
    );

    // Untouched ones are still untouched.
    for name in ["reboot-other", "power-off", "reboot-elsewhere"] {
        let op = api.get(name).await.expect("get");
        assert_eq!(op.status, None, "{name} was touched");
    }
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn agent_upgrade_hands_off_in_both_install_modes() {
    let sc = Scenario::up().await;
    let mut host = sc.node("host-node", &[], InstallMode::Host).await;
    let mut container = sc.node("container-node", &[], InstallMode::Container).await;
    host.host.serve_artifact(URL, SHA, v2());
    container.host.serve_image(IMAGE, v2());

    sc.create(
        "up-host",
        MachineOperationSpec {
            machine_ref: Some("host-node".into()),
            ..upgrade(URL, SHA)
        },
    )
    .await;
    sc.create(
        "up-image",
        MachineOperationSpec {
            machine_ref: Some("container-node".into()),
            ..upgrade("oci://registry.example/flexnode:v2", IMAGE)
        },
    )
    .await;
    for (agent, op) in [(&mut host, "up-host"), (&mut container, "up-image")] {
        sc.wait_for(op, 30, |o| phase(o) == Some(OperationPhase::InProgress))
            .await;
        // Only the successor publishes: wait for the restart the old daemon scheduled.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !agent.fire_restart_timer().await {
            assert!(Instant::now() < deadline, "{op}: no restart scheduled");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let done = sc.wait_terminal(op).await;
        assert_eq!(reason(&done), "True/Succeeded", "{op}");
        assert_eq!(
            done.status.and_then(|s| s.message).as_deref(),
            Some("AgentUpgrade completed")
        );
    }
    // Two upgrades at once: the second waits (Pending) until the first is judged, then runs.
    let to_host = || MachineOperationSpec {
        machine_ref: Some("host-node".into()),
        ..upgrade(URL, SHA)
    };
    // up-a's download takes long: the daemon is inside its step when up-b arrives, and marks
    // it Pending then, not once the step is over (the native tier found it deaf meanwhile).
    let staging = Duration::from_secs(15);
    host.host.world().slow.insert("stage_archive", staging);
    sc.create("up-a", to_host()).await;
    sc.wait_for("up-a", 30, |o| phase(o) == Some(OperationPhase::InProgress))
        .await;
    sc.create("up-b", to_host()).await;
    sc.wait_for("up-b", 10, |o| phase(o) == Some(OperationPhase::Pending))
        .await;
    let a = sc.ops().get("up-a").await.expect("get");
    assert_eq!(
        phase(&a),
        Some(OperationPhase::InProgress),
        "up-b waits while up-a runs"
    );
    assert!(
        host.host.world().restart_timers.is_empty(),
        "up-a was already staged: Pending came after its step, not during it"
    );
    host.host.world().slow.remove("stage_archive");
    for op in ["up-a", "up-b"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !host.fire_restart_timer().await {
            assert!(Instant::now() < deadline, "{op}: no restart scheduled");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            reason(&sc.wait_terminal(op).await),
            "True/Succeeded",
            "{op}"
        );
    }
    // Scheduling the restart fails: switched back, with the fixed message.
    host.host.inject("schedule_restart", FaultKind::Fail, 0);
    sc.create("up-c", to_host()).await;
    let done = sc.wait_terminal("up-c").await;
    assert_eq!(reason(&done), "False/ExecutionFailed");
    assert_eq!(
        done.status.and_then(|s| s.message).as_deref(),
        Some("failed to restart upgraded agent daemon")
    );
    host.kill().await;
    container.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_killed_daemon_and_an_unreachable_api_server_still_give_one_result() {
    let sc = Scenario::up().await;
    let mut agent = sc.node("edge-07", &[], InstallMode::Host).await;

    // The process dies right after restarting the machine, before recording it.
    agent.host.inject("restart", FaultKind::CrashAfter, 0);
    sc.create(
        "reboot-crash",
        spec(Some("edge-07"), OperationKind::NodeReboot),
    )
    .await;
    agent.wait_exit().await;
    let op = sc.ops().get("reboot-crash").await.expect("get");
    assert_eq!(
        phase(&op),
        Some(OperationPhase::InProgress),
        "died mid-operation"
    );
    agent.start();
    let op = sc.wait_terminal("reboot-crash").await;
    assert_eq!(reason(&op), "True/Succeeded");
    assert_eq!(
        machine_restarts(&agent.host),
        1,
        "the machine restart was not repeated"
    );

    // The API server stops for 30 s while an operation runs; the result lands afterwards.
    agent
        .host
        .world()
        .slow
        .insert("restart", Duration::from_secs(3));
    sc.create(
        "reboot-outage",
        spec(Some("edge-07"), OperationKind::NodeReboot),
    )
    .await;
    sc.wait_for("reboot-outage", 30, |o| {
        phase(o) == Some(OperationPhase::InProgress)
    })
    .await;
    let pid: i32 = std::fs::read_to_string(sc.lab.dir.join("pids/kube-apiserver.pid"))
        .expect("pid")
        .trim()
        .parse()
        .expect("pid number");
    // Signalled only if that PID is still this lab's apiserver (not a reused PID).
    let signal = |sig: &str| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains("kube-apiserver")
                && cmdline.contains(&sc.lab.dir.display().to_string()),
            "pid {pid} is not this lab's kube-apiserver: {cmdline:?}"
        );
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    tokio::time::sleep(Duration::from_secs(30)).await;
    signal("-CONT");
    let op = sc.wait_terminal("reboot-outage").await;
    assert_eq!(reason(&op), "True/Succeeded");
    assert_eq!(machine_restarts(&agent.host), 2);
    // Killed once more and restarted: nothing is run or published again, once the new daemon
    // has listed the operations and decided about each.
    let since = logs::mark();
    agent.restart().await;
    let listed = logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("operations listed") && l.contains("node=edge-07") && l.contains("watch=own")
    })
    .await
    .expect("the restarted daemon listed the operations");
    assert!(listed.contains("waiting=0"), "{listed}");
    assert_eq!(machine_restarts(&agent.host), 2);

    // A failure seconds after the claim: the Completed condition stays False (InProgress →
    // ExecutionFailed), and still carries the instant of completedAt (`wait_terminal`).
    agent
        .host
        .world()
        .slow
        .insert("restart", Duration::from_millis(2500));
    agent.host.inject("restart", FaultKind::Fail, 0);
    sc.create(
        "reboot-fails",
        spec(Some("edge-07"), OperationKind::NodeReboot),
    )
    .await;
    assert_eq!(
        reason(&sc.wait_terminal("reboot-fails").await),
        "False/ExecutionFailed"
    );
    agent.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn agent_reset_and_the_deletion_signal_reset_the_node() {
    let sc = Scenario::up().await;
    let mut reset = sc.node("edge-07", &[], InstallMode::Host).await;
    let mut deleted = sc.node("edge-08", &[], InstallMode::Host).await;

    // AgentReset: the result is published, then the agent uninstalls itself and stops.
    sc.create("reset-1", spec(Some("edge-07"), OperationKind::AgentReset))
        .await;
    let op = sc.wait_terminal("reset-1").await;
    assert_eq!(reason(&op), "True/Succeeded");
    assert_eq!(
        op.status.and_then(|s| s.message).as_deref(),
        Some("AgentReset completed")
    );
    reset.wait_exit().await;
    {
        let w = reset.host.world();
        assert!(w.units.is_empty(), "units left: {:?}", w.units.keys());
        assert_eq!(w.current, None);
        assert!(!w.runtime_files);
        assert!(w.calls.iter().any(|c| c.starts_with("remove_unit")));
    }

    // The deletion signal: taint alone waits; taint + Machine gone resets.
    let since = logs::mark();
    let nodes: Api<Node> = Api::all(sc.client.clone());
    let taint = serde_json::json!({"spec": {"taints": [{
        "key": "kubernetes.azure.com/flex-node-deleting", "value": "true", "effect": "NoSchedule"}]}});
    nodes
        .patch(
            "edge-08",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&taint),
        )
        .await
        .expect("taint");
    let seen = logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("goal observed")
            && l.contains("node=edge-08")
            && l.contains("tainted for deletion")
    })
    .await
    .expect("the daemon observed the taint");
    assert!(seen.contains("outcome=Ready"), "{seen}");
    assert!(
        deleted.host.world().runtime_files,
        "a taint alone must not wipe"
    );
    Api::<Machine>::all(sc.client.clone())
        .delete("edge-08", &DeleteParams::default())
        .await
        .expect("delete machine");
    deleted.wait_exit().await;
    let w = deleted.host.world();
    assert!(!w.runtime_files && w.units.is_empty());
}

/// Without the Machine API (its CRD not installed) the daemon still claims and runs the
/// node's operations, with no `observedMachineGeneration`: the Machine's watch reports the
/// type as not served once instead of keeping the claims waiting for a first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn operations_run_without_the_machine_api() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let sc = Scenario::up().await;
    let crds: Api<CustomResourceDefinition> = Api::all(sc.client.clone());
    crds.delete("machines.unbounded-cloud.io", &DeleteParams::default())
        .await
        .expect("delete the Machine CRD");
    let deadline = Instant::now() + Duration::from_secs(60);
    while crds
        .get_opt("machines.unbounded-cloud.io")
        .await
        .expect("crd")
        .is_some()
    {
        assert!(Instant::now() < deadline, "the Machine CRD was not removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut node = Node::default();
    node.metadata.name = Some("edge-09".into());
    Api::<Node>::all(sc.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
    let mut agent = Agent::join(&sc.lab, "edge-09", InstallMode::Host).await;
    sc.create("reboot-9", spec(Some("edge-09"), OperationKind::NodeReboot))
        .await;
    let op = sc.wait_terminal("reboot-9").await;
    assert_eq!(phase(&op), Some(OperationPhase::Complete));
    let s = op.status.clone().expect("status");
    assert_eq!(s.observed_machine_generation, None);
    assert_eq!(machine_restarts(&agent.host), 1);
    agent.kill().await;
}

/// A repave that fails is tried again after a pause that doubles per failure, not at every
/// tick (the power-cut soak found a boot where containerd was not up yet retried about once
/// a second: docs/reliability.md, "Power-cut soak"); once the cause is gone the next try
/// applies the goal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_failed_repave_is_tried_again_after_a_pause() {
    let sc = Scenario::up().await;
    create_node_and_machine(&sc.client, "edge-09", &[]).await;
    let config = flexnode::reconcile::DaemonConfig {
        node_name: "edge-09".into(),
        tick: Duration::from_millis(300),
        repave_retry: Duration::from_secs(2),
        ..Default::default()
    };
    let agent = Agent::join_with(
        support::agent::agent_client(&sc.lab, "edge-09").await,
        tempfile::tempdir().expect("tmp"),
        InstallMode::Host,
        config,
    )
    .await;
    let broken = "provision_machine(kube2)";
    agent.host.world().broken.insert(broken.into());
    let tries = || {
        agent
            .host
            .world()
            .calls
            .iter()
            .filter(|c| *c == broken)
            .count()
    };

    // A new goal with the Node gone: a repave, whose provisioning fails every time.
    let since = logs::mark();
    let machines: Api<Machine> = Api::all(sc.client.clone());
    let goal = serde_json::json!({"spec": {"kubernetes": {"version": "v1.34.3"}}});
    machines
        .patch(
            "edge-09",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&goal),
        )
        .await
        .expect("new goal");
    Api::<Node>::all(sc.client.clone())
        .delete("edge-09", &DeleteParams::default())
        .await
        .expect("delete node");
    let first = logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("the repave failed 1 time(s) in a row; it is tried again in 2 s")
    })
    .await;
    assert!(first.is_some(), "no paused repave failure logged");
    // Tries at 0 s and 2 s, the next at 6 s: about 17 ticks in these 5 s, two tries.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let paced = tries();
    assert!(
        (2..=3).contains(&paced),
        "{paced} provisioning tries in about 5 s"
    );
    assert!(
        !logs::lines(since, |l| l
            .contains("failed 2 time(s) in a row; it is tried again in 4 s"))
        .is_empty(),
        "the second failure doubles the pause"
    );

    // The cause gone: the next try applies the goal.
    agent.host.world().broken.clear();
    let applied = support::wait_for(Duration::from_secs(30), || async {
        let m = machines.get("edge-09").await.ok()?;
        let generation = m.metadata.generation?;
        let c = m
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "NodeUpdated")?;
        (c.reason == "Applied" && c.observed_generation == Some(generation)).then_some(c)
    })
    .await;
    assert!(
        applied.is_some(),
        "the goal was not applied once the cause was gone"
    );
    assert!(tries() <= 4, "{} tries", tries());
}
