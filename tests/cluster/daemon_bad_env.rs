//! A bad environment under the real daemon (watches, claims, status writes) against a real
//! kube-apiserver, with the simulated host underneath: a store on a filesystem that fills up
//! (a real tmpfs, real ENOSPC), a wall clock that jumps across a deadline, and the Machine's
//! condition and Events for a fault. The booted-systemd side (STATUS, exit 78, a read-only
//! `/etc`) is tests/node/host_bad_env.rs.

use crate::support;

use flexnode::api::Machine;
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode::effects::kube::KubePublisher;
use flexnode::exec::Clock;
use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::lifecycle::fault::{Fault, FaultKind};
use flexnode::lifecycle::policy::Policy;
use flexnode::lifecycle::result::MachinePhase;
use flexnode::reconcile::DaemonConfig;
use flexnode::reconcile::clock::{SteadyClock, boottime};
use flexnode::sim::Build;
use flexnode::store::StoreReader;
use flexnode_test_tier::tier;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};
use support::agent::{Agent, admin, agent_client, apply_rbac, create_node_and_machine};
use support::tmpfs::Tmpfs;
use support::{Lab, logs, wait_for};

async fn create(client: &Client, name: &str, spec: MachineOperationSpec) {
    Api::<MachineOperation>::all(client.clone())
        .create(&PostParams::default(), &MachineOperation::new(name, spec))
        .await
        .expect("create the operation");
}

fn reboot(node: &str) -> MachineOperationSpec {
    MachineOperationSpec {
        machine_ref: Some(node.into()),
        operation_kind: OperationKind::NodeReboot,
        ..Default::default()
    }
}

/// The operation once `want` holds (at most `secs`).
async fn op_when(
    client: &Client,
    name: &str,
    secs: u64,
    want: impl Fn(&MachineOperation) -> bool,
) -> MachineOperation {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let found = wait_for(Duration::from_secs(secs), || async {
        api.get_opt(name).await.ok().flatten().filter(|op| want(op))
    })
    .await;
    match found {
        Some(op) => op,
        None => panic!(
            "{name}: {:?}",
            api.get_opt(name).await.map(|o| o.map(|o| o.status))
        ),
    }
}

fn phase(op: &MachineOperation) -> Option<OperationPhase> {
    op.status.as_ref().and_then(|s| s.phase)
}

/// The Machine's phase and `NodeUpdated` reason.
async fn machine_shows(client: &Client, node: &str) -> (String, String, String) {
    let m = Api::<Machine>::all(client.clone())
        .get(node)
        .await
        .expect("the Machine");
    let s = m.status.unwrap_or_default();
    let c = s
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "NodeUpdated")
        .map(|c| (c.reason, c.message))
        .unwrap_or_default();
    (
        s.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
        c.0,
        c.1,
    )
}

async fn wait_machine(client: &Client, node: &str, reason: &str) -> (String, String, String) {
    wait_for(Duration::from_secs(30), || async {
        let shown = machine_shows(client, node).await;
        (shown.1 == reason).then_some(shown)
    })
    .await
    .unwrap_or_else(|| panic!("the Machine never showed {reason}"))
}

/// Events about `kind`/`name`, by reason.
async fn events(client: &Client, kind: &str, name: &str) -> Vec<(String, String)> {
    let list = Api::<Event>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("events");
    list.items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

async fn wait_event(client: &Client, kind: &str, name: &str, reason: &str) -> String {
    wait_for(Duration::from_secs(30), || async {
        events(client, kind, name)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, note)| note)
    })
    .await
    .unwrap_or_else(|| panic!("no {reason} Event for {kind} {name}"))
}

/// The store's journal as `flexnode history` reads it (the daemon keeps running).
fn journal_inputs(store: &Path) -> Vec<String> {
    StoreReader::open(store)
        .expect("the store reads (quick_check passes)")
        .journal(1000)
        .expect("journal")
        .into_iter()
        .map(|e| e.input)
        .collect()
}

/// A node whose store lives on a 2 MiB tmpfs of its own.
async fn node_on_small_disk(lab: &Lab, admin: &Client, name: &str) -> (Agent, Tmpfs) {
    create_node_and_machine(admin, name, &[]).await;
    let dir = tempfile::tempdir().expect("tmp");
    let disk = Tmpfs::mount(&dir.path().join("state"), 2048);
    let config = DaemonConfig {
        node_name: name.into(),
        tick: Duration::from_millis(300),
        ..Default::default()
    };
    let agent = Agent::join_with(
        agent_client(lab, name).await,
        dir,
        InstallMode::Host,
        config,
    )
    .await;
    (agent, disk)
}

/// A NodeReboot created while the store's disk is full: held, told, then run once.
async fn a_full_disk_holds_new_work_and_loses_none(lab: &Lab, client: &Client) {
    let client = client.clone();
    let mark = logs::mark();
    let (agent, disk) = node_on_small_disk(lab, &client, "full-1").await;
    // Started: what a daemon writes at start-up is written.
    logs::wait_line(mark, Duration::from_secs(30), |l| {
        l.contains("operations listed") && l.contains("node=full-1")
    })
    .await
    .expect("the daemon listed the operations");

    let filler = disk.fill("filler");
    create(&client, "reboot-full", reboot("full-1")).await;
    // The daemon's own account first: the Machine says why nothing runs.
    let (phase_shown, _, message) = wait_machine(&client, "full-1", "DiskFull").await;
    assert_eq!(phase_shown, "Failed");
    assert!(message.contains("free space"), "{message}");
    let note = wait_event(&client, "Machine", "full-1", "DiskFull").await;
    assert!(note.contains("no space left"), "{note}");
    // The operation was not claimed: Pending, told why, and nothing ran.
    let op = op_when(&client, "reboot-full", 30, |op| {
        phase(op) == Some(OperationPhase::Pending)
    })
    .await;
    let said = op.status.and_then(|s| s.message).unwrap_or_default();
    assert!(said.contains("DiskFull"), "{said}");
    assert!(
        !agent
            .host
            .world()
            .calls
            .iter()
            .any(|c| c.starts_with("restart(systemd-nspawn")),
        "a machine was restarted on a full disk"
    );
    assert!(
        !journal_inputs(&agent.store)
            .iter()
            .any(|i| i.contains("reboot-full")),
        "a step of the operation was recorded on a full disk"
    );

    // Space comes back: the agent resumes by itself, runs it once, says the fault is over.
    std::fs::remove_file(&filler).expect("free the space");
    let op = op_when(&client, "reboot-full", 60, MachineOperation::is_terminal).await;
    assert_eq!(
        phase(&op),
        Some(OperationPhase::Complete),
        "{:?}",
        op.status
    );
    let (phase_shown, reason, _) = wait_machine(&client, "full-1", "Applied").await;
    assert_eq!(
        (phase_shown.as_str(), reason.as_str()),
        ("Ready", "Applied")
    );
    wait_event(&client, "Machine", "full-1", "FaultCleared").await;
    let restarts = agent
        .host
        .world()
        .calls
        .iter()
        .filter(|c| c.starts_with("restart(systemd-nspawn"))
        .count();
    assert_eq!(restarts, 1, "the reboot ran exactly once");
    let claims = journal_inputs(&agent.store)
        .into_iter()
        .filter(|i| i.contains("OperationClaimed") && i.contains("reboot-full"))
        .count();
    assert_eq!(claims, 1, "claimed exactly once");
    let terminal_events = events(&client, "MachineOperation", "reboot-full")
        .await
        .into_iter()
        .filter(|(r, _)| r == "Succeeded" || r == "ExecutionFailed")
        .count();
    assert_eq!(terminal_events, 1, "one terminal Event");
    drop(agent);
}

/// An AgentUpgrade's successor starts on a full disk: its judgement waits, then is made once.
async fn a_hand_off_is_judged_once_the_store_takes_writes(lab: &Lab, client: &Client) {
    let client = client.clone();
    let (mut agent, disk) = node_on_small_disk(lab, &client, "full-2").await;
    const SHA: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    let url = "https://artifacts.example/flexnode-v2.tar.gz";
    agent.host.serve_artifact(
        url,
        SHA,
        Build {
            version: "0.2.0".into(),
            crashes: false,
        },
    );
    create(
        &client,
        "upgrade-full",
        MachineOperationSpec {
            machine_ref: Some("full-2".into()),
            operation_kind: OperationKind::AgentUpgrade,
            parameters: Some(BTreeMap::from([
                ("downloadURL".to_string(), url.to_string()),
                ("sha256".to_string(), SHA.to_string()),
            ])),
            ..Default::default()
        },
    )
    .await;
    // The old daemon switched and scheduled its successor: the disk fills before it starts.
    wait_for(Duration::from_secs(30), || async {
        (!agent.host.world().restart_timers.is_empty()).then_some(())
    })
    .await
    .expect("the restart timer");
    // A reader keeps the WAL and its index in place across the restart (SQLite removes them
    // with the last connection): the successor opens the store, and its first write, the
    // judgement, finds no room.
    let reader = StoreReader::open(&agent.store).expect("a reader");
    let filler = disk.fill("filler");
    assert!(agent.fire_restart_timer().await);
    wait_machine(&client, "full-2", "DiskFull").await;
    drop(reader);
    let op = op_when(&client, "upgrade-full", 5, |_| true).await;
    assert_eq!(
        phase(&op),
        Some(OperationPhase::InProgress),
        "judged on a full disk"
    );
    std::fs::remove_file(&filler).expect("free the space");
    let op = op_when(&client, "upgrade-full", 60, MachineOperation::is_terminal).await;
    let s = op.status.expect("status");
    assert_eq!(s.phase, Some(OperationPhase::Complete), "{s:?}");
    assert_eq!(s.message.as_deref(), Some("AgentUpgrade completed"));
    wait_machine(&client, "full-2", "Applied").await;
    let judged = StoreReader::open(&agent.store)
        .expect("the store reads")
        .journal(1000)
        .expect("journal")
        .into_iter()
        .filter(|e| e.from.starts_with("Upgrading") && e.input.starts_with("DaemonStarted"))
        .count();
    assert_eq!(judged, 1, "the hand-off judged once");
}

/// The publisher's fault and its end on a Machine: written once, cleared once.
async fn a_fault_shows_on_the_machine_once_and_clears(lab: &Lab, client: &Client) {
    let client = client.clone();
    create_node_and_machine(&client, "shown-1", &[]).await;
    let publisher = KubePublisher::new(agent_client(lab, "shown-1").await, "shown-1");
    let fault = Fault::new(
        FaultKind::StoreCorrupt,
        Path::new("/var/lib/flexnode/state.db"),
        "database disk image is malformed",
    );
    assert!(publisher.report_fault(&fault).await.expect("written"));
    let (phase_shown, reason, message) = machine_shows(&client, "shown-1").await;
    assert_eq!(
        (phase_shown.as_str(), reason.as_str()),
        ("Failed", "StoreCorrupt")
    );
    assert!(message.contains("malformed") && message.contains("flexnode reset --yes"));
    let note = wait_event(&client, "Machine", "shown-1", "StoreCorrupt").await;
    assert_eq!(note, message);
    // The same fault again (a restarted daemon) writes nothing and records no second Event.
    assert!(!publisher.report_fault(&fault).await.expect("read"));
    // Over: the phase the core reports comes back, once.
    assert!(
        publisher
            .clear_fault(MachinePhase::Ready, "StoreCorrupt is over", Some(1))
            .await
            .expect("cleared")
    );
    let (phase_shown, reason, _) = machine_shows(&client, "shown-1").await;
    assert_eq!(
        (phase_shown.as_str(), reason.as_str()),
        ("Ready", "Applied")
    );
    assert!(
        !publisher
            .clear_fault(MachinePhase::Ready, "again", Some(1))
            .await
            .expect("read")
    );
    wait_event(&client, "Machine", "shown-1", "FaultCleared").await;
    let reasons: Vec<String> = events(&client, "Machine", "shown-1")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(
        reasons.iter().filter(|r| *r == "StoreCorrupt").count(),
        1,
        "{reasons:?}"
    );
    assert_eq!(
        reasons.iter().filter(|r| *r == "FaultCleared").count(),
        1,
        "{reasons:?}"
    );
}

/// A wall clock the test moves, and the daemon's clock over it and the real `CLOCK_BOOTTIME`.
fn movable_clock() -> (Arc<AtomicI64>, SteadyClock) {
    let offset = Arc::new(AtomicI64::new(0));
    let o = offset.clone();
    let clock = SteadyClock::with_sources(
        Arc::new(move || {
            let now = flexnode::exec::SystemClock.now().millis();
            Timestamp::from_millis(now + o.load(Ordering::SeqCst))
        }),
        Arc::new(boottime),
        None,
    );
    (offset, clock)
}

/// An AgentUpgrade whose successor never starts (the restart timer is not fired) fails when
/// its hand-off deadline passes: after the wall clock is set `jump_ms` away, it must fail
/// neither before the deadline's budget nor long after it.
async fn hand_off_deadline_with_jump(lab: &Lab, client: &Client, node: &str, jump_ms: i64) {
    const BUDGET: u64 = 4;
    create_node_and_machine(client, node, &[]).await;
    let config = DaemonConfig {
        node_name: node.into(),
        tick: Duration::from_millis(200),
        ..Default::default()
    };
    let dir = tempfile::tempdir().expect("tmp");
    let mut agent = Agent::join_with(
        agent_client(lab, node).await,
        dir,
        InstallMode::Host,
        config,
    )
    .await;
    let (offset, clock) = movable_clock();
    agent.clock = Some(clock);
    agent.policy = Some(Policy {
        handoff_secs: BUDGET as i64,
        ..Policy::default()
    });
    agent.restart().await;
    const SHA: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
    let url = format!("https://artifacts.example/{node}.tar.gz");
    agent.host.serve_artifact(
        &url,
        SHA,
        Build {
            version: "0.2.0".into(),
            crashes: false,
        },
    );
    let op = format!("upgrade-{node}");
    create(
        client,
        &op,
        MachineOperationSpec {
            machine_ref: Some(node.into()),
            operation_kind: OperationKind::AgentUpgrade,
            parameters: Some(BTreeMap::from([
                ("downloadURL".to_string(), url.clone()),
                ("sha256".to_string(), SHA.to_string()),
            ])),
            ..Default::default()
        },
    )
    .await;
    // HandingOff begins when the restart is scheduled.
    wait_for(Duration::from_secs(30), || async {
        (!agent.host.world().restart_timers.is_empty()).then_some(())
    })
    .await
    .expect("the restart timer");
    let handing_off = Instant::now();
    offset.store(jump_ms, Ordering::SeqCst);
    let done = op_when(client, &op, 30, MachineOperation::is_terminal).await;
    let took = handing_off.elapsed();
    let s = done.status.expect("status");
    assert_eq!(s.phase, Some(OperationPhase::Failed), "{s:?}");
    assert!(
        took >= Duration::from_secs(BUDGET) - Duration::from_millis(300),
        "jump {jump_ms} ms: the deadline fired early, after {took:?}"
    );
    assert!(
        took < Duration::from_secs(BUDGET + 3),
        "jump {jump_ms} ms: the deadline was held, {took:?}"
    );
    // Its times are the agent's own: one timeline, whatever the wall clock did.
    assert!(s.started_at <= s.completed_at, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_store_on_a_full_disk_loses_no_operation() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    a_fault_shows_on_the_machine_once_and_clears(&lab, &client).await;
    a_full_disk_holds_new_work_and_loses_none(&lab, &client).await;
    a_hand_off_is_judged_once_the_store_takes_writes(&lab, &client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_wall_clock_jump_moves_no_deadline() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    tokio::join!(
        // Back an hour: a wall-clock deadline would hold the operation an hour more.
        hand_off_deadline_with_jump(&lab, &client, "clock-back", -3_600_000),
        // Forward an hour: a wall-clock deadline would fire at once.
        hand_off_deadline_with_jump(&lab, &client, "clock-fwd", 3_600_000),
    );
}
