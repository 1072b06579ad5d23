//! The API server away (docs/reliability.md, "The API server away"): the lab's kube-apiserver
//! and etcd stopped for minutes while an AgentUpgrade (a real host install: systemd in a
//! booted nspawn container), a NodeReboot and an AgentReset (the real daemon over the
//! simulated host) are in the middle of their work, then started again with etcd's data kept;
//! and started again on an empty etcd, the CRDs and RBAC applied anew.
//!
//! `FLEXNODE_APISERVER_AWAY_SECS` sets the outage (300 s, what CI runs).

use crate::support::Lab;
use crate::support::account::{host_store_account, journaled_at, store_account};
use crate::support::agent::{Agent, admin, apply_rbac, create_node_and_machine};
use crate::support::artifacts::{Served, pack};
use crate::support::history::{History, Seen, events, status_writes};
use crate::support::hostnode::HostNode;
use crate::support::logs;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode::api::{Machine, MachineOperation};
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::SimHost;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp as JiffTime;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

/// How long the simulated effects and the throttled download take: longer than the API
/// server's stop (seconds), so each operation is in the middle of its work when it goes.
const WORK: Duration = Duration::from_secs(30);

fn outage() -> Duration {
    let secs = match std::env::var("FLEXNODE_APISERVER_AWAY_SECS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("FLEXNODE_APISERVER_AWAY_SECS={v:?}: want seconds")),
        Err(_) => 300,
    };
    let outage = Duration::from_secs(secs);
    assert!(
        outage >= 2 * WORK,
        "FLEXNODE_APISERVER_AWAY_SECS={secs}: the work under way ({} s) must end during the outage; \
         use at least {} s",
        WORK.as_secs(),
        2 * WORK.as_secs()
    );
    outage
}

/// Reboots and resets without a drain: a drain needs the API server (a drain it meets away
/// fails the operation with nothing disrupted, docs/drain.md); this test is of the work that
/// goes on without it.
fn spec(node: &str, kind: OperationKind) -> MachineOperationSpec {
    let parameters = match kind {
        OperationKind::NodeReboot | OperationKind::AgentReset => {
            Some(BTreeMap::from([("drain".to_string(), "false".to_string())]))
        }
        OperationKind::AgentUpgrade
        | OperationKind::HostReboot
        | OperationKind::HostPowerOff
        | OperationKind::HostPowerOn
        | OperationKind::HostReplace
        | OperationKind::Unknown => None,
    };
    MachineOperationSpec {
        machine_ref: Some(node.into()),
        operation_kind: kind,
        parameters,
        ..Default::default()
    }
}

async fn create(ops: &Api<MachineOperation>, name: &str, spec: MachineOperationSpec) -> String {
    ops.create(&PostParams::default(), &MachineOperation::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
        .metadata
        .uid
        .expect("a UID")
}

fn calls(host: &SimHost, prefix: &str) -> usize {
    host.world()
        .calls
        .iter()
        .filter(|c| c.starts_with(prefix))
        .count()
}

fn in_progress(s: &Seen) -> bool {
    s.phase == Some(OperationPhase::InProgress)
}

fn ms_between(from: SystemTime, to: JiffTime) -> i64 {
    let from = from
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as i64;
    to.as_millisecond() - from
}

/// The agent unit's MainPID in the container.
fn main_pid(host: &HostNode) -> String {
    let out = host
        .container
        .exec(&["systemctl", "show", "-P", "MainPID", "flexnode-agent"]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The agent unit's journal since `since` (µs), one line each, for a failure's message.
fn journal_text(host: &HostNode, since: u64) -> String {
    host.journal(since)
        .into_iter()
        .map(|l| format!("{} {}", l.usec, l.message))
        .collect::<Vec<_>>()
        .join("\n")
}

fn now_usec() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// The operation's Events once its result's is recorded: reason → count.
async fn events_of(admin: &Client, uid: &str, result: &str) -> BTreeMap<String, i32> {
    crate::support::wait_for(Duration::from_secs(30), || async {
        let by = events(admin, uid).await;
        by.contains_key(result).then_some(by)
    })
    .await
    .unwrap_or_else(|| panic!("no {result} Event for {uid}"))
}

pub async fn the_api_server_away_for_minutes_in_the_middle_of_three_operations() {
    let outage = outage();
    let lab = Lab::up_audited();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let history = History::record(admin.clone());
    let ops: Api<MachineOperation> = Api::all(admin.clone());

    // The real host: an archive of this build, served throttled so that staging lasts WORK.
    let bin = Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let served = tempfile::tempdir().expect("a directory to serve");
    let served_log = tempfile::tempdir().expect("a directory for the server's log");
    let (archive, sha) = pack(served.path(), "next", bin);
    let size = std::fs::metadata(served.path().join(&archive))
        .expect("the archive")
        .len();
    let chunk = size / (WORK.as_millis() as u64 / 100) + 1;
    let access_log = served_log.path().join("access.log");
    let server = Served::throttled(served.path(), chunk, 0.1, &access_log);
    let upgrader = HostNode::join(
        &lab,
        &format!("fxaw-{}", std::process::id()),
        "away-upgrade",
        bin,
    );
    // The simulated ones, whose work takes WORK.
    create_node_and_machine(&admin, "away-reboot", &[]).await;
    let rebooter = Agent::join(&lab, "away-reboot", InstallMode::Host).await;
    create_node_and_machine(&admin, "away-reset", &[]).await;
    let mut resetter = Agent::join(&lab, "away-reset", InstallMode::Host).await;
    rebooter.host.world().slow.insert("restart", WORK);
    resetter.host.world().slow.insert("wipe_runtime", WORK);

    let t_claims = now_usec().saturating_sub(2_000_000);
    let mut uids = BTreeMap::new();
    let upgrade = MachineOperationSpec {
        parameters: Some(BTreeMap::from([
            (
                "downloadURL".to_string(),
                server.url(&format!("slow/{archive}")),
            ),
            ("sha256".to_string(), sha),
        ])),
        ..spec("away-upgrade", OperationKind::AgentUpgrade)
    };
    uids.insert("upgrade-away", create(&ops, "upgrade-away", upgrade).await);
    uids.insert(
        "reboot-away",
        create(
            &ops,
            "reboot-away",
            spec("away-reboot", OperationKind::NodeReboot),
        )
        .await,
    );
    uids.insert(
        "reset-away",
        create(
            &ops,
            "reset-away",
            spec("away-reset", OperationKind::AgentReset),
        )
        .await,
    );
    for name in ["upgrade-away", "reboot-away", "reset-away"] {
        history
            .wait(name, Duration::from_secs(60), in_progress)
            .await;
    }
    // A second reboot reaches the daemon while the first one's restart runs: it is claimable
    // when that ends, with the API server away.
    let received = rebooter.counters();
    let before = received.operation_events.load(Ordering::Relaxed);
    uids.insert(
        "reboot-after",
        create(
            &ops,
            "reboot-after",
            spec("away-reboot", OperationKind::NodeReboot),
        )
        .await,
    );
    let got = crate::support::wait_for(Duration::from_secs(30), || async {
        (received.operation_events.load(Ordering::Relaxed) > before).then_some(())
    })
    .await;
    assert!(
        got.is_some(),
        "away-reboot's watch did not deliver reboot-after"
    );

    // ---- the API server goes away, each operation in the middle of its work ----
    let t_stop = Instant::now();
    let t_stop_usec = now_usec();
    lab.stop_apiserver();
    let stopped = Instant::now();
    let staged = |host: &HostNode| {
        host.journal(t_claims)
            .iter()
            .any(|l| l.message.contains("to=Upgrading/Switching"))
    };
    assert_eq!(
        calls(&rebooter.host, "restart(systemd-nspawn"),
        0,
        "the reboot finished before the API server was away (its stop took {:?})",
        stopped - t_stop
    );
    assert_eq!(
        calls(&resetter.host, "wipe_runtime"),
        0,
        "the reset's wipe finished before the API server was away"
    );
    assert!(
        !staged(&upgrader),
        "the upgrade's staging finished before the API server was away"
    );
    // The work goes on without it: the machine restarted, the node wiped, the upgrade handed
    // off to a new daemon that judged it (its result waits in the outbox).
    let within = WORK + Duration::from_secs(30);
    let done = crate::support::wait_for(within, || async {
        (calls(&rebooter.host, "restart(systemd-nspawn") == 1).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "the reboot did not go on without the API server"
    );
    // The next reboot (reboot-after) at full speed.
    rebooter.host.world().slow.remove("restart");
    let done = crate::support::wait_for(within, || async {
        (calls(&resetter.host, "wipe_runtime") == 1).then_some(())
    })
    .await;
    assert!(
        done.is_some(),
        "the reset did not go on without the API server"
    );
    let claim = upgrader
        .journal(t_claims)
        .into_iter()
        .find(|l| {
            l.message
                .contains("input=OperationClaimed(AgentUpgrade upgrade-away)")
        })
        .expect("the upgrade's claim in the journal")
        .usec;
    let judged = crate::support::wait_for(within, || async {
        upgrader
            .journal(claim)
            .into_iter()
            .find(|l| l.usec >= claim && l.message.contains("input=DaemonStarted("))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the upgrade was not handed off without the API server:\n{}",
            journal_text(&upgrader, claim)
        )
    });
    let successor = main_pid(&upgrader);
    assert!(
        stopped.elapsed() < outage,
        "the work took the whole outage: nothing was left for the API server's return"
    );
    println!(
        "OUTAGE the work under way ended {:.1} s into the outage; the upgrade's successor (pid {successor}) judged it at {}",
        stopped.elapsed().as_secs_f64(),
        judged.usec
    );
    tokio::time::sleep_until((stopped + outage).into()).await;

    // ---- back, with its data ----
    let since = logs::mark();
    let back = lab.start_apiserver(false);
    let back_usec = back
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_micros() as u64;
    println!(
        "OUTAGE the API server was away {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    for name in uids.keys() {
        history
            .wait(name, Duration::from_secs(180), Seen::terminal)
            .await;
    }

    // Each operation: one result, over its whole history, its status writes and its Events.
    // Two writes each (InProgress, the result), and a third before them when the operation
    // arrived while a step ran and was marked Pending (src/reconcile/owner.rs `feed`): always
    // for reboot-after, which arrived during the first reboot's restart and was claimed once
    // the API server was back, not failed by its absence; for the others only when their
    // daemon's first steps after joining still ran.
    let want = [
        (
            "upgrade-away",
            "AgentUpgrade completed",
            "away-upgrade",
            false,
        ),
        ("reboot-away", "NodeReboot completed", "away-reboot", false),
        ("reset-away", "AgentReset completed", "away-reset", false),
        ("reboot-after", "NodeReboot completed", "away-reboot", true),
    ];
    for (name, message, node, must_wait) in want {
        let pending = history
            .of(name)
            .iter()
            .any(|s| s.phase == Some(OperationPhase::Pending));
        assert!(pending || !must_wait, "{name} was never marked Pending");
        let writes = if pending { 3 } else { 2 };
        let result = history.one_result(name);
        assert_eq!(
            result.phase,
            Some(OperationPhase::Complete),
            "{name}: {result:?}"
        );
        assert_eq!(result.reason, "True/Succeeded", "{name}");
        assert_eq!(result.message, message, "{name}");
        let accepted = status_writes(&lab, name);
        assert_eq!(
            accepted.len(),
            writes,
            "{name}'s status writes: {accepted:?}"
        );
        let user = format!("system:flexnode:{node}");
        assert!(
            accepted.iter().all(|w| w.user == user),
            "{name}: {accepted:?}"
        );
        let published = accepted.last().expect("a write").at;
        println!(
            "RECOVERY result {name} published {} ms after the API server's return",
            ms_between(back, published)
        );
        let ev = events_of(&admin, &uids[name], "Succeeded").await;
        assert_eq!(ev.get("InProgress"), Some(&1), "{name}'s Events: {ev:?}");
        assert_eq!(ev.get("Succeeded"), Some(&1), "{name}'s Events: {ev:?}");
        assert_eq!(
            ev.get("Waiting").copied().unwrap_or(0),
            i32::from(pending),
            "{name}'s Events: {ev:?}"
        );
        let others = ev
            .keys()
            .filter(|r| !["InProgress", "Succeeded", "Waiting"].contains(&r.as_str()))
            .count();
        assert_eq!(others, 0, "{name}'s Events: {ev:?}");
    }
    // Claimed (journaled by its store) once the API server was back, not from the watch's
    // cache while it was away: its first status write could only come after `back` anyway.
    let claimed = journaled_at(&rebooter.store, "OperationClaimed(NodeReboot reboot-after")
        .expect("reboot-after's claim in the store");
    let back_ms = back
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as i64;
    assert!(
        claimed >= back_ms,
        "reboot-after was claimed {} ms before the API server was back",
        back_ms - claimed
    );

    // Nothing disruptive ran twice.
    assert_eq!(
        calls(&rebooter.host, "restart(systemd-nspawn"),
        2,
        "two reboots ran"
    );
    assert_eq!(calls(&resetter.host, "wipe_runtime"), 1);
    assert_eq!(
        calls(&resetter.host, "remove_unit(flexnode-agent.service"),
        1
    );
    let starts = upgrader
        .journal(claim)
        .iter()
        .filter(|l| l.usec >= claim && l.message.starts_with("Started flexnode-agent.service"))
        .count();
    assert_eq!(
        starts,
        1,
        "the agent restarted once, for the hand-off:\n{}",
        journal_text(&upgrader, claim)
    );
    let access = std::fs::read_to_string(&access_log).expect("the artifact server's log");
    let downloads = access
        .lines()
        .filter(|l| l.contains(&format!("GET /slow/{archive} start")))
        .count();
    assert_eq!(downloads, 1, "the archive was downloaded once: {access}");

    // The watches came back in the daemons that ran through the outage, without a restart.
    let resynced =
        |l: &str, node: &str| l.contains("watch resynced") && l.contains(&format!("node={node} "));
    let counters = rebooter.counters();
    let settled = crate::support::wait_for(Duration::from_secs(90), || async {
        (counters.resyncs.load(Ordering::Relaxed) >= 4 && counters.connected()).then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "away-reboot's watches did not resync: {counters:?}"
    );
    assert!(rebooter.running(), "away-reboot's daemon stopped");
    assert_eq!(
        counters.interruptions.load(Ordering::Relaxed),
        4,
        "one interruption per watch: {counters:?}"
    );
    for line in logs::lines(since, |l| resynced(l, "away-reboot")) {
        println!(
            "RECOVERY away-reboot {} ms after the API server's return: {line}",
            ms_between(back, logs::time_of(&line))
        );
    }
    // From the stop, not from `back`: the API server answers lists a moment before its
    // /readyz first says ready, and a watch may resync in that moment.
    let host_lines = crate::support::wait_for(Duration::from_secs(90), || async {
        let lines: Vec<_> = upgrader
            .journal(t_stop_usec)
            .into_iter()
            .filter(|l| l.usec >= t_stop_usec && resynced(&l.message, "away-upgrade"))
            .collect();
        (lines.len() >= 4).then_some(lines)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "away-upgrade's four watches did not resync within 90 s of the API server's return; its watch lines since the outage:\n{}",
            journal_text(&upgrader, t_stop_usec)
                .lines()
                .filter(|l| l.contains("watch") || l.contains("Started"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    });
    for l in &host_lines {
        println!(
            "RECOVERY away-upgrade {} ms after the API server's return: {}",
            (l.usec as i64 - back_usec as i64) / 1000,
            l.message
        );
    }
    assert_eq!(
        main_pid(&upgrader),
        successor,
        "the upgraded daemon was restarted"
    );
    let restarted = upgrader
        .journal(judged.usec)
        .iter()
        .filter(|l| l.usec > judged.usec && l.message.contains("flexnode daemon starting"))
        .count();
    assert_eq!(
        restarted,
        0,
        "the upgraded daemon started again:\n{}",
        journal_text(&upgrader, claim)
    );

    // The reset's daemon ended by itself, once its result was published.
    resetter.wait_exit().await;
    assert!(resetter.host.world().units.is_empty());

    // Every store kept everything: journals whole, outboxes drained.
    let account = store_account(&rebooter.store);
    account.intact("away-reboot");
    assert_eq!(account.inputs("OperationClaimed(NodeReboot reboot-away"), 1);
    assert_eq!(
        account.inputs("OperationClaimed(NodeReboot reboot-after"),
        1
    );
    let account = store_account(&resetter.store);
    account.intact("away-reset");
    assert_eq!(account.inputs("OperationClaimed(AgentReset reset-away"), 1);
    let account = host_store_account(&upgrader);
    account.intact("away-upgrade");
    assert_eq!(
        account.inputs("OperationClaimed(AgentUpgrade upgrade-away"),
        1
    );
    assert_eq!(
        account.inputs("DaemonStarted("),
        1,
        "the successor judged the hand-off once"
    );
    println!(
        "OUTAGE the test's own watch listed again {} times",
        history.relists()
    );
}

/// The agents' access after the data loss comes back in parts, in an order that shows each
/// decision acting on one object the watches re-listed while the other is still the one seen
/// before the loss (a restore applies what it applies in its own order): first every agent
/// gets its operations; wiped-2 its Machine (the deletion signal's second half), wiped-3 its
/// Node (a repave's permission). Then `manifests/rbac/` as a whole.
const RBAC_FIRST: &str = r#"{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"flexnode-agent"},
  "rules":[{"apiGroups":["unbounded-cloud.io"],"resources":["machineoperations"],"verbs":["get","list","watch","delete"]},
           {"apiGroups":["unbounded-cloud.io"],"resources":["machineoperations/status"],"verbs":["get","update","patch"]},
           {"apiGroups":["","events.k8s.io"],"resources":["events"],"verbs":["create","patch"]}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"flexnode-agent"},
  "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"flexnode-agent"},
  "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"Group","name":"flexnode:agents"}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"away-machines"},
  "rules":[{"apiGroups":["unbounded-cloud.io"],"resources":["machines"],"verbs":["get","list","watch"]}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"away-machines"},
  "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"away-machines"},
  "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"system:flexnode:wiped-2"}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"away-nodes"},
  "rules":[{"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","watch"]}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"away-nodes"},
  "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"away-nodes"},
  "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"system:flexnode:wiped-3"}]}]}"#;

pub async fn the_api_server_back_without_its_data() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    create_node_and_machine(&admin, "wiped-1", &[]).await;
    let worker = Agent::join(&lab, "wiped-1", InstallMode::Host).await;
    create_node_and_machine(&admin, "wiped-2", &[]).await;
    let tainted = Agent::join(&lab, "wiped-2", InstallMode::Host).await;
    create_node_and_machine(&admin, "wiped-3", &[]).await;
    let pending = Agent::join(&lab, "wiped-3", InstallMode::Host).await;

    // Before: one reboot done, one in the middle of its work, one received while it runs.
    create(&ops, "w-done", spec("wiped-1", OperationKind::NodeReboot)).await;
    wait_phase(&ops, "w-done", OperationPhase::Complete).await;
    worker.host.world().slow.insert("restart", WORK);
    create(
        &ops,
        "w-running",
        spec("wiped-1", OperationKind::NodeReboot),
    )
    .await;
    wait_phase(&ops, "w-running", OperationPhase::InProgress).await;
    let received = worker.counters();
    let before = received.operation_events.load(Ordering::Relaxed);
    let waiting_uid = create(
        &ops,
        "w-waiting",
        spec("wiped-1", OperationKind::NodeReboot),
    )
    .await;
    let got = crate::support::wait_for(Duration::from_secs(30), || async {
        (received.operation_events.load(Ordering::Relaxed) > before).then_some(())
    })
    .await;
    assert!(got.is_some(), "wiped-1's watch did not deliver w-waiting");
    // Half the deletion signal on wiped-2: its Node tainted, its Machine still there.
    let since = logs::mark();
    let taint = serde_json::json!({"spec": {"taints": [{
        "key": "kubernetes.azure.com/flex-node-deleting", "value": "true", "effect": "NoSchedule"}]}});
    Api::<Node>::all(admin.clone())
        .patch("wiped-2", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint");
    logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("goal observed") && l.contains("node=wiped-2") && l.contains("tainted")
    })
    .await
    .expect("wiped-2's daemon saw the taint");
    // A new goal for wiped-3 (generation 2): it waits for its Node to go, the repave's
    // permission.
    let goal = serde_json::json!({"spec": {"kubernetes": {"version": "v1.34.3"}}});
    Api::<Machine>::all(admin.clone())
        .patch("wiped-3", &PatchParams::default(), &Patch::Merge(&goal))
        .await
        .expect("a new goal");
    logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("goal observed")
            && l.contains("node=wiped-3")
            && l.contains("node present, machine generation 2")
            && l.contains("outcome=Ready")
    })
    .await
    .expect("wiped-3's daemon saw the new goal and waits");

    // Away: the running reboot finishes, its result waits in the outbox.
    lab.stop_apiserver();
    assert_eq!(
        calls(&worker.host, "restart(systemd-nspawn"),
        1,
        "w-running finished before the API server was away"
    );
    let restarted = crate::support::wait_for(Duration::from_secs(60), || async {
        (calls(&worker.host, "restart(systemd-nspawn") == 2).then_some(())
    })
    .await;
    assert!(
        restarted.is_some(),
        "w-running did not finish without the API server"
    );
    // The restart is counted when it returns; the step's outcome (and the result in the
    // outbox) is committed right after it.
    let held = crate::support::wait_for(Duration::from_secs(30), || async {
        let held = store_account(&worker.store).unpublished;
        (!held.is_empty()).then_some(held)
    })
    .await
    .unwrap_or_default();
    assert_eq!(held, ["w-running"], "the result waits in the outbox");

    // Back on an empty etcd: the CRDs applied again by the script, then the agents' access
    // in two parts (RBAC_FIRST).
    let since = logs::mark();
    let back = lab.start_apiserver(true);
    let first = tempfile::tempdir().expect("a directory for the manifest");
    let path = first.path().join("rbac.json");
    std::fs::write(&path, RBAC_FIRST).expect("write the manifest");
    let (ok, out) = lab.kubectl(&["apply", "-f", &path.display().to_string()]);
    assert!(ok, "{out}");
    let resynced = |node: &str, watch: &str| {
        let (node, watch) = (format!("node={node} "), format!("watch={watch} "));
        move |l: &str| l.contains("watch resynced") && l.contains(&node) && l.contains(&watch)
    };
    // wiped-2: the Machine re-listed gone, the tainted Node still as seen before the loss.
    logs::wait_line(
        since,
        Duration::from_secs(120),
        resynced("wiped-2", "machine"),
    )
    .await
    .expect("wiped-2's Machine watch resynced");
    // wiped-3: the Node re-listed gone, the Machine still asking for generation 2.
    logs::wait_line(since, Duration::from_secs(120), resynced("wiped-3", "node"))
        .await
        .expect("wiped-3's Node watch resynced");
    // Each daemon read both before deciding; the one read it may not make leaves it waiting.
    for node in ["wiped-2", "wiped-3"] {
        let node = format!("node={node} ");
        logs::wait_line(since, Duration::from_secs(30), |l| {
            l.contains(&node) && l.contains("the Node and the Machine not confirmed by a read")
        })
        .await
        .unwrap_or_else(|| panic!("{node}: no decision waited for a read"));
    }
    apply_rbac(&lab);
    for agent in [&worker, &tainted, &pending] {
        let counters = agent.counters();
        let settled = crate::support::wait_for(Duration::from_secs(120), || async {
            (counters.resyncs.load(Ordering::Relaxed) >= 4 && counters.connected()).then_some(())
        })
        .await;
        assert!(
            settled.is_some(),
            "{}'s watches did not resync: {counters:?}",
            agent.name
        );
        assert!(agent.running(), "{}'s daemon stopped", agent.name);
        for line in logs::lines(since, |l| {
            l.contains("watch resynced") && l.contains(&format!("node={} ", agent.name))
        }) {
            println!(
                "RECOVERY (wiped) {} {} ms after the API server's return: {line}",
                agent.name,
                ms_between(back, logs::time_of(&line))
            );
        }
    }
    // Neither node resets: the Node vanished with the Machine, no taint is left.
    let seen = logs::wait_line(since, Duration::from_secs(60), |l| {
        l.contains("goal observed")
            && l.contains("node=wiped-2")
            && l.contains("node absent, machine missing")
    })
    .await
    .expect("wiped-2's daemon observed the loss");
    assert!(seen.contains("outcome=Ready"), "{seen}");
    assert!(tainted.host.world().runtime_files, "wiped-2 was wiped");
    assert_eq!(calls(&tainted.host, "wipe_runtime"), 0);
    // Nor does wiped-3 repave to the goal that went with the data.
    let seen = logs::wait_line(since, Duration::from_secs(60), |l| {
        l.contains("goal observed")
            && l.contains("node=wiped-3")
            && l.contains("node absent, machine missing")
    })
    .await
    .expect("wiped-3's daemon observed the loss");
    assert!(seen.contains("outcome=Ready"), "{seen}");
    assert_eq!(
        calls(&pending.host, "provision_machine(kube2"),
        0,
        "wiped-3 repaved"
    );

    // wiped-1: the outbox drops the result of the operation that is gone; the waiting one
    // is never claimed.
    let dropped = crate::support::wait_for(Duration::from_secs(30), || async {
        store_account(&worker.store)
            .unpublished
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(
        dropped.is_some(),
        "the outbox kept retrying a vanished operation's result"
    );
    logs::wait_line(since, Duration::from_secs(30), |l| {
        l.contains("operations listed") && l.contains("node=wiped-1") && l.contains("watch=own")
    })
    .await
    .expect("wiped-1 listed its operations");
    let account = store_account(&worker.store);
    account.intact("wiped-1");
    assert_eq!(account.inputs(&waiting_uid), 0, "w-waiting was claimed");
    assert_eq!(account.inputs("w-waiting"), 0, "w-waiting was claimed");
    assert_eq!(
        calls(&worker.host, "restart(systemd-nspawn"),
        2,
        "nothing ran again"
    );
    // The agent does not create its Machine (the deletion signal's first half is the
    // Machine's deletion): it is reported missing.
    let machines: Api<Machine> = Api::all(admin.clone());
    assert!(machines.get_opt("wiped-1").await.expect("get").is_none());

    // It keeps working once its Node and Machine are back (as the kubelet and `flexnode join`
    // make them): a new operation is claimed and finished.
    create_node_and_machine(&admin, "wiped-1", &[]).await;
    create(&ops, "w-after", spec("wiped-1", OperationKind::NodeReboot)).await;
    let done = wait_phase(&ops, "w-after", OperationPhase::Complete).await;
    assert_eq!(
        done.status.and_then(|s| s.observed_machine_generation),
        Some(1)
    );
    assert_eq!(calls(&worker.host, "restart(systemd-nspawn"), 3);
    assert!(worker.running() && tainted.running() && pending.running());
}

async fn wait_phase(
    ops: &Api<MachineOperation>,
    name: &str,
    phase: OperationPhase,
) -> MachineOperation {
    crate::support::wait_for(Duration::from_secs(60), || async {
        let op = ops.get_opt(name).await.ok().flatten()?;
        (op.status.as_ref().and_then(|s| s.phase) == Some(phase)).then_some(op)
    })
    .await
    .unwrap_or_else(|| panic!("{name} never reached {phase:?}"))
}
