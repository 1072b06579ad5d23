//! `flexnode rollout` (the built binary) against a real kube-apiserver, with a daemon per node
//! on simulated hosts: waves keep to `--max-unavailable` (counted from a watch of the
//! operations), the first failure stops the rollout naming the node, `--resume` goes on
//! without repeating a node that is done, and a second rollout on one selector is refused.

use crate::support;

use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::OperationPhase;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::FaultKind;
use flexnode_test_tier::tier;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::agent::{Agent, admin, apply_rbac, create_node_and_machine};
use support::cli::Run;
use support::{Lab, wait_for};

const LABEL: &str = "flexnode.io/rollout";

/// ARGS with a wave timeout of 120 s unless they name one: a wave that hangs ends the rollout
/// (exit 3, its nodes' phases printed) instead of after the default 30 minutes, so a stuck
/// agent fails the test with the story.
fn bounded<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut args = args.to_vec();
    if !args.contains(&"--wave-timeout") {
        args.extend(["--wave-timeout", "120s"]);
    }
    args
}

fn rollout(kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    support::cli::command("rollout", kubeconfig, &bounded(args))
}

async fn run(kubeconfig: &Path, args: &[&str]) -> Run {
    support::cli::run("rollout", kubeconfig, &bounded(args)).await
}

/// The most operations of the rollouts that were going at once, per rollout, from a watch
/// (whose events the API server orders).
#[derive(Default)]
struct InFlight {
    going: BTreeSet<String>,
    most: std::collections::BTreeMap<String, usize>,
}

fn track(api: Api<MachineOperation>) -> Arc<Mutex<InFlight>> {
    let seen = Arc::new(Mutex::new(InFlight::default()));
    let shared = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default().labels(LABEL)).boxed();
        while let Some(event) = stream.next().await {
            let (Ok(Event::Apply(op)) | Ok(Event::InitApply(op))) = event else {
                continue;
            };
            let name = op.metadata.name.clone().unwrap_or_default();
            let rollout = op
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL))
                .cloned()
                .unwrap_or_default();
            let terminal = op.is_terminal();
            let mut s = shared.lock().expect("lock");
            if terminal {
                s.going.remove(&name);
            } else {
                s.going.insert(name);
            }
            let now = s
                .going
                .iter()
                .filter(|n| n.starts_with(&format!("{rollout}-")))
                .count();
            let most = s.most.entry(rollout).or_default();
            *most = (*most).max(now);
        }
    });
    seen
}

async fn operations(api: &Api<MachineOperation>, rollout: &str) -> BTreeSet<String> {
    api.list(&ListParams::default().labels(&format!("{LABEL}={rollout}")))
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect()
}

async fn phase_label(maps: &Api<ConfigMap>, rollout: &str) -> Option<String> {
    maps.list(&ListParams::default().labels(&format!("{LABEL}={rollout}")))
        .await
        .expect("list")
        .items
        .into_iter()
        .next()
        .and_then(|m| m.metadata.labels?.get("flexnode.io/rollout-phase").cloned())
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn waves_keep_the_limit_stop_at_a_failure_resume_and_refuse_a_second_rollout() {
    let lab = Lab::up();
    // ≈ 40 s on an idle 2-core machine.
    let steps = lab.watchdog(Duration::from_secs(600));
    steps.at("joining six simulated agents");
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let kc = lab.kubeconfig();
    let kc = kc.as_path();
    let mut agents = Vec::new();
    for (name, tier) in [
        ("edge-1", "edge"),
        ("edge-2", "edge"),
        ("edge-3", "edge"),
        ("edge-4", "edge"),
        ("edge-5", "edge"),
        ("core-1", "core"),
    ] {
        create_node_and_machine(&admin, name, &[("tier", tier)]).await;
        let agent = Agent::join(&lab, name, InstallMode::Host).await;
        // A reboot takes a moment, so a wave's operations overlap.
        agent
            .host
            .world()
            .slow
            .insert("restart", Duration::from_millis(700));
        agents.push(agent);
    }
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let inflight = track(ops.clone());

    steps.at("r1 --dry-run");
    // --dry-run: the waves, nothing created.
    let r1 = [
        "reboot",
        "--selector",
        "tier=edge",
        "--max-unavailable",
        "40%",
        "--name",
        "r1",
    ];
    let r = run(kc, &[&r1[..], &["--dry-run"]].concat()).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout
            .contains("on 5 of 5 nodes matching tier=edge, 40% at a time (3 waves)"),
        "{r:?}"
    );
    assert!(r.stdout.contains("wave 1: edge-1 edge-2\n"), "{r:?}");
    assert!(r.stdout.contains("wave 3: edge-5\n"), "{r:?}");
    assert!(operations(&ops, "r1").await.is_empty());
    assert_eq!(phase_label(&maps, "r1").await, None);

    steps.at("r1, stopping at edge-4");
    // edge-4's reboot fails: the rollout stops after its wave and names it.
    agents[3].host.inject("restart", FaultKind::Fail, 0);
    let r = run(kc, &r1).await;
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(
        r.stderr
            .contains("r1 stopped at node edge-4 (machineoperation/r1-edge-4-1): ExecutionFailed"),
        "{r:?}"
    );
    assert!(r.stderr.contains("flexnode rollout --resume r1"), "{r:?}");
    assert!(r.stdout.contains("  edge-3: Complete"), "{r:?}");
    assert_eq!(
        operations(&ops, "r1").await,
        names(&["r1-edge-1-1", "r1-edge-2-1", "r1-edge-3-1", "r1-edge-4-1"]),
        "wave 3 never started"
    );
    assert_eq!(phase_label(&maps, "r1").await.as_deref(), Some("Stopped"));

    // Another rollout on the selector is refused while r1 is not complete.
    let r = run(kc, &["reboot", "--selector", "tier=edge", "--name", "r2"]).await;
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("rollout r1 (Stopped"), "{r:?}");
    assert!(operations(&ops, "r2").await.is_empty());

    steps.at("r1 --resume");
    // Resumed: edge-4 gets a new operation, edge-5 its first; nothing done runs again.
    let r = run(kc, &["--resume", "r1"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("rollout r1 complete: 5 nodes"), "{r:?}");
    assert_eq!(
        operations(&ops, "r1").await,
        names(&[
            "r1-edge-1-1",
            "r1-edge-2-1",
            "r1-edge-3-1",
            "r1-edge-4-1",
            "r1-edge-4-2",
            "r1-edge-5-1"
        ])
    );
    for name in ["r1-edge-4-2", "r1-edge-5-1"] {
        let op = ops.get(name).await.expect("get");
        assert_eq!(
            op.status.and_then(|s| s.phase),
            Some(OperationPhase::Complete),
            "{name}"
        );
    }
    assert_eq!(phase_label(&maps, "r1").await.as_deref(), Some("Complete"));
    let r = run(kc, &["--resume", "r1"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.contains("already complete"), "{r:?}");

    steps.at("c1 and c2 at once");
    // Two at once on one selector: the second is refused while the first runs (its node's
    // agent is down, so its wave waits), then the first finishes.
    agents[5].kill().await;
    let first = rollout(
        kc,
        &[
            "reboot",
            "--selector",
            "tier=core",
            "--name",
            "c1",
            "--wave-timeout",
            "100s",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start c1");
    let recorded = wait_for(Duration::from_secs(30), || async {
        phase_label(&maps, "c1").await.filter(|p| p == "Running")
    })
    .await;
    assert!(recorded.is_some(), "c1 never recorded itself");
    let r = run(kc, &["reboot", "--selector", "tier=core", "--name", "c2"]).await;
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stderr.contains("rollout c1 (Running"), "{r:?}");
    agents[5].start();
    let out = tokio::time::timeout(Duration::from_secs(120), first.wait_with_output())
        .await
        .expect("c1 finishes")
        .expect("c1");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(operations(&ops, "c2").await.is_empty());
    steps.at("c3");
    // A complete rollout frees its selector.
    let r = run(kc, &["reboot", "--selector", "tier=core", "--name", "c3"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");

    steps.at("t1 and its resume");
    // A wave that does not finish in time stops the rollout (exit 3); the resume waits for
    // the same operation rather than starting another.
    agents[5].kill().await;
    let r = run(
        kc,
        &[
            "reboot",
            "--selector",
            "tier=core",
            "--name",
            "t1",
            "--wave-timeout",
            "3s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(3), "{r:?}");
    assert!(
        r.stderr.contains("the wave did not finish within 3s"),
        "{r:?}"
    );
    assert_eq!(phase_label(&maps, "t1").await.as_deref(), Some("Stopped"));
    agents[5].start();
    let r = run(kc, &["--resume", "t1"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(operations(&ops, "t1").await, names(&["t1-core-1-1"]));

    let most = inflight.lock().expect("lock").most.clone();
    assert_eq!(
        most.get("r1"),
        Some(&2),
        "r1 went at most 2 at a time: {most:?}"
    );
    assert_eq!(most.get("c1"), Some(&1), "{most:?}");
}
