//! The real core, store and executor against the simulated host (the crashes at every effect
//! boundary of every transition: `tests/crash_simulation/main.rs`).

use flexnode::lifecycle::agent::{AgentBuild, InstallMode, Slot};
use flexnode::lifecycle::input::ClaimKind;
use flexnode::lifecycle::result::ResultReason;
use flexnode::lifecycle::state::Side;
use flexnode::lifecycle::{Input, NodeState, Timestamp};
use flexnode::sim::{ApiWrite, Build, FaultKind};
use flexnode::sim::{SimNode, upgrade};

const T0: Timestamp = Timestamp::from_millis(1_785_578_400_000);
const URL: &str = "https://artifacts.example/flexnode-v2.tar.gz?sig=SECRETSAS";
const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const IMAGE: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn v2(crashes: bool) -> Build {
    Build {
        version: "0.2.0".into(),
        crashes,
    }
}

async fn joined(dir: &tempfile::TempDir, mode: InstallMode) -> SimNode {
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    node.join(mode, "edge-07").await.expect("join");
    node.boot().await.expect("daemon starts");
    node
}

const NODE_IMAGE: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

/// The node image the simulated registry serves.
fn node_image() -> flexnode::config::NodeImage {
    flexnode::config::NodeImage {
        image: flexnode::lifecycle::agent::ImageRef {
            registry: "registry.example".into(),
            repository: "node".into(),
            tag: None,
        },
        digest: flexnode::lifecycle::agent::Sha256Hex::parse(NODE_IMAGE).expect("digest"),
    }
}

/// Joined with a node image for the goal's version: its machines run a kubelet.
async fn joined_with_kubelet(dir: &tempfile::TempDir) -> SimNode {
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    node.host.serve_image(NODE_IMAGE, v2(false));
    node.node_images
        .pins
        .insert(flexnode::sim::GOAL_VERSION.to_string(), node_image());
    node.join(InstallMode::Host, "edge-07").await.expect("join");
    node.boot().await.expect("daemon starts");
    node
}

fn results_for(node: &SimNode, uid: &str) -> Vec<(ResultReason, String)> {
    node.host
        .results()
        .into_iter()
        .filter(|(op, _)| op.uid == uid)
        .map(|(_, r)| (r.reason, r.message))
        .collect()
}

fn state(node: &mut SimNode) -> NodeState {
    node.runner().expect("open").state().expect("state")
}

fn count_calls(node: &SimNode, prefix: &str) -> usize {
    node.host
        .world()
        .calls
        .iter()
        .filter(|c| c.starts_with(prefix))
        .count()
}

#[tokio::test]
async fn join_installs_units_machine_and_reports_ready() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    let w = node.host.world();
    assert!(w.units["flexnode-agent.service"].active);
    assert!(w.units["flexnode-agent.service"].enabled);
    assert_eq!(w.units.len(), 4);
    assert!(w.machines[&Side::Kube1].running);
    assert_eq!(w.current, Some(AgentBuild::Slot { slot: Slot::Blue }));
    assert!(matches!(
        w.api.last(),
        Some(ApiWrite::Machine {
            observed_generation: Some(1),
            ..
        })
    ));
    drop(w);
    assert!(matches!(state(&mut node), NodeState::Ready { .. }));
}

#[tokio::test]
async fn join_from_a_node_image_pulls_unpacks_and_waits_for_the_node() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined_with_kubelet(&dir).await;
    {
        let w = node.host.world();
        let kube1 = &w.machines[&Side::Kube1];
        assert_eq!(kube1.image.as_deref(), Some(NODE_IMAGE));
        assert!(kube1.running);
        assert!(
            w.images.contains_key(NODE_IMAGE),
            "the node image was pulled"
        );
        assert!(w.drop_ins.contains_key("systemd-nspawn@kube1.service"));
        let calls = w.calls.join(" ");
        for call in [
            "pull(",
            "clear_machine_tree(kube1)",
            "unpack_image_into(",
            "complete_machine(kube1)",
            "node_seen(",
        ] {
            assert!(calls.contains(call), "no {call} in {calls}");
        }
        assert!(
            !calls.contains("provision_machine("),
            "the minimal tree was built: {calls}"
        );
    }
    assert!(matches!(state(&mut node), NodeState::Ready { .. }));
    // The daemon's status shows the Node as the join saw it.
    let reader = flexnode::store::StoreReader::open(&node.path).expect("reader");
    let report = flexnode::status_report::build(&reader).expect("report");
    let kubelet = report.kubelet.expect("the Node as last seen");
    assert_eq!(kubelet.node.ready, "True");
    assert!(
        flexnode::status_report::render_human(
            &flexnode::status_report::build(&reader).expect("report")
        )
        .contains("Kubelet:          Ready=True (KubeletReady)")
    );
}

#[tokio::test]
async fn a_kubernetes_version_without_a_node_image_fails_the_join_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    node.node_images
        .pins
        .insert("v1.0.0".to_string(), node_image());
    node.join(InstallMode::Host, "edge-07")
        .await
        .expect("join runs");
    assert!(matches!(state(&mut node), NodeState::Unjoined { .. }));
    let history = flexnode::store::StoreReader::open(&node.path)
        .expect("reader")
        .journal(20)
        .expect("journal");
    let text = format!("{history:?}");
    assert!(text.contains("no node image for Kubernetes"), "{text}");
}

#[tokio::test]
async fn host_upgrade_hands_off_to_the_successor_which_publishes() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.serve_artifact(URL, SHA, v2(false));
    node.claim("u1", upgrade(URL, SHA)).await.expect("claim");
    assert!(
        results_for(&node, "u1").is_empty(),
        "only the successor publishes"
    );
    node.settle().await.expect("handoff");
    assert_eq!(
        results_for(&node, "u1"),
        [(
            ResultReason::Succeeded,
            "AgentUpgrade completed".to_string()
        )]
    );
    let w = node.host.world();
    assert_eq!(w.current, Some(AgentBuild::Slot { slot: Slot::Green }));
    assert_eq!(w.last_good, Some(AgentBuild::Slot { slot: Slot::Blue }));
    drop(w);
    let st = state(&mut node);
    assert_eq!(
        st.node().map(|n| n.agent.clone()),
        Some(AgentBuild::Slot { slot: Slot::Green })
    );
    // The journal never holds the SAS token.
    let journal = node
        .runner()
        .expect("open")
        .store()
        .journal(100)
        .expect("journal");
    assert!(journal.len() >= 6);
    assert!(
        journal
            .iter()
            .all(|e| !format!("{e:?}").contains("SECRETSAS"))
    );
}

#[tokio::test]
async fn crash_looping_candidate_is_rolled_back_by_the_recovery_unit() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.serve_artifact(URL, SHA, v2(true));
    node.claim("u1", upgrade(URL, SHA)).await.expect("claim");
    node.settle().await.expect("recovery");
    let results = results_for(&node, "u1");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, ResultReason::DaemonFailed);
    assert_eq!(
        node.host.world().current,
        Some(AgentBuild::Slot { slot: Slot::Blue })
    );
    assert_eq!(node.host.world().agent_restarts, 1);
    // Upgrade back to a good build afterwards.
    node.host.serve_artifact(URL, SHA, v2(false));
    node.claim("u2", upgrade(URL, SHA)).await.expect("claim");
    node.settle().await.expect("handoff");
    assert_eq!(results_for(&node, "u2")[0].0, ResultReason::Succeeded);
}

/// The recovery restarts the agent even when resetting its failed state fails: the restart is
/// what brings the last-good build back.
#[tokio::test]
async fn the_recovery_restarts_the_agent_when_its_failed_state_cannot_be_reset() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.serve_artifact(URL, SHA, v2(true));
    node.host
        .world()
        .broken
        .insert("reset_failed(flexnode-agent.service)".into());
    node.claim("u1", upgrade(URL, SHA)).await.expect("claim");
    node.settle().await.expect("recovery");
    let results = results_for(&node, "u1");
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, ResultReason::DaemonFailed);
    assert_eq!(
        node.host.world().current,
        Some(AgentBuild::Slot { slot: Slot::Blue })
    );
    assert_eq!(node.host.world().agent_restarts, 1);
}

#[tokio::test]
async fn container_upgrade_pulls_by_digest_and_switches_image() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Container).await;
    node.host.serve_image(IMAGE, v2(false));
    node.claim("u1", upgrade("oci://registry.example/flexnode:v2", IMAGE))
        .await
        .expect("claim");
    node.settle().await.expect("handoff");
    assert_eq!(results_for(&node, "u1")[0].0, ResultReason::Succeeded);
    assert!(
        count_calls(
            &node,
            &format!("pull(registry.example/flexnode@sha256:{IMAGE})")
        ) == 1
    );
}

#[tokio::test]
async fn only_images_the_agent_pulled_are_removed() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Container).await;
    node.host.serve_image(IMAGE, v2(false));
    // Pulled, then its check fails: the agent's own image is removed and forgotten.
    node.host.inject("check_image", FaultKind::Fail, 0);
    node.claim("u1", upgrade("oci://registry.example/flexnode:v2", IMAGE))
        .await
        .expect("claim");
    assert_eq!(results_for(&node, "u1")[0].0, ResultReason::ExecutionFailed);
    assert!(!node.host.world().images.contains_key(IMAGE));
    assert!(
        !node
            .runner()
            .expect("open")
            .store()
            .is_agent_image(IMAGE)
            .expect("query")
    );
    // An image an operator pulled (not in the store) is never removed.
    node.host
        .world()
        .images
        .insert(IMAGE.to_string(), v2(false));
    node.host.world().foreign_images.insert(IMAGE.to_string());
    node.host.inject("check_image", FaultKind::Fail, 0);
    node.claim("u2", upgrade("oci://registry.example/flexnode:v2", IMAGE))
        .await
        .expect("claim");
    assert_eq!(results_for(&node, "u2")[0].0, ResultReason::ExecutionFailed);
    assert!(
        node.host.world().images.contains_key(IMAGE),
        "the operator's image stays"
    );
}

#[tokio::test]
async fn wrong_digest_fails_the_stage_and_rolls_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host
        .serve_artifact(URL, &SHA.replace('a', "c"), v2(false));
    node.claim("u1", upgrade(URL, SHA)).await.expect("claim");
    node.settle().await.expect("nothing to settle");
    let r = results_for(&node, "u1");
    assert_eq!(r[0].0, ResultReason::ExecutionFailed);
    assert!(!r[0].1.contains("SECRETSAS"), "{}", r[0].1);
    assert_eq!(
        node.host.world().current,
        Some(AgentBuild::Slot { slot: Slot::Blue })
    );
    assert!(node.host.world().restart_timers.is_empty());
}

#[tokio::test]
async fn invalid_parameters_execute_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    let before = node.host.world().calls.len();
    node.claim("u1", upgrade("https://user:hunter2@a.example/f.tgz", SHA))
        .await
        .expect("claim");
    let calls = node.host.world().calls[before..].to_vec();
    assert_eq!(calls, ["publish_result(op-u1)"]);
    let r = results_for(&node, "u1");
    assert_eq!(r[0].0, ResultReason::InvalidParameters);
    assert!(!r[0].1.contains("hunter2"));
}

#[tokio::test]
async fn node_reboot_restarts_the_active_machine() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    let before = node.host.world().machines[&Side::Kube1].started_at;
    node.claim("r1", ClaimKind::node_reboot())
        .await
        .expect("claim");
    assert!(node.host.world().machines[&Side::Kube1].started_at > before);
    assert_eq!(
        results_for(&node, "r1"),
        [(ResultReason::Succeeded, "NodeReboot completed".to_string())]
    );
}

/// A NodeReboot drains first: the Node cordoned with the operation's mark, its pods evicted
/// before the machine restarts. An `Uncordon` that meets the API server away keeps the
/// drain's record and does not hold up the result; the node at rest lifts the cordon when the
/// outbox is next flushed (the daemon's tick).
#[tokio::test]
async fn node_reboot_drains_first_and_its_cordon_outlives_no_outage() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.world().pods = vec!["default/web-0".into(), "default/web-1".into()];
    node.host.inject("uncordon", FaultKind::Fail, 0);
    node.claim("r1", ClaimKind::node_reboot())
        .await
        .expect("claim");
    assert_eq!(
        results_for(&node, "r1"),
        [(ResultReason::Succeeded, "NodeReboot completed".to_string())]
    );
    {
        let w = node.host.world();
        assert_eq!(w.evictions, ["default/web-0", "default/web-1"]);
        let at = |prefix: &str| w.calls.iter().position(|c| c.starts_with(prefix));
        let (cordon, evicted, restarted) =
            (at("cordon("), at("evict("), at("restart(systemd-nspawn"));
        assert!(cordon < evicted && evicted < restarted, "{:?}", w.calls);
        assert_eq!(
            w.cordon.as_deref(),
            Some("operation/r1"),
            "the outage kept the cordon"
        );
    }
    let record = node.runner().expect("open").store().cordon().expect("read");
    assert!(record.is_some_and(|r| r.holder == "operation/r1" && r.cordoned));
    node.runner()
        .expect("open")
        .flush_outbox()
        .await
        .expect("flush");
    assert_eq!(node.host.world().cordon, None, "lifted at rest");
    assert_eq!(
        node.runner().expect("open").store().cordon().expect("read"),
        None
    );
}

/// An operator's cordon (no mark) is theirs: the drain evicts under it and never lifts it;
/// `drain: "false"` evicts nothing.
#[tokio::test]
async fn an_operators_cordon_stays_and_drain_false_evicts_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.world().pods = vec!["default/web-0".into()];
    node.host.world().cordon = Some(String::new());
    let undrained = ClaimKind::NodeReboot {
        parameters: [("drain".to_string(), "false".to_string())].into(),
    };
    node.claim("r1", undrained).await.expect("claim");
    assert!(node.host.world().evictions.is_empty());
    node.claim("r2", ClaimKind::node_reboot())
        .await
        .expect("claim");
    let w = node.host.world();
    assert_eq!(w.evictions, ["default/web-0"]);
    assert_eq!(
        w.cordon.as_deref(),
        Some(""),
        "the operator's cordon was touched"
    );
}

#[tokio::test]
async fn agent_reset_publishes_before_uninstalling_and_rejoin_works() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.claim("x1", ClaimKind::agent_reset())
        .await
        .expect("claim");
    {
        let w = node.host.world();
        let publish = w
            .calls
            .iter()
            .position(|c| c == "publish_result(op-x1)")
            .expect("published");
        let uninstall = w
            .calls
            .iter()
            .position(|c| c.starts_with("remove_unit"))
            .expect("removed");
        assert!(publish < uninstall);
        assert!(w.units.is_empty(), "no unit left: {:?}", w.units.keys());
        assert_eq!(w.current, None);
        assert!(!w.runtime_files);
        assert!(
            w.machines
                .values()
                .all(|m| !m.running && m.kubernetes_version.is_none())
        );
    }
    assert!(matches!(state(&mut node), NodeState::Unjoined { .. }));
    node.stop_process();
    node.join(InstallMode::Host, "edge-07")
        .await
        .expect("re-join");
    node.boot().await.expect("daemon");
    assert!(matches!(state(&mut node), NodeState::Ready { .. }));
}

#[tokio::test]
async fn reset_result_waits_in_the_store_when_the_api_is_down() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    // The API server goes away after the claim's progress report.
    for _ in 0..8 {
        node.host.inject("publish_result", FaultKind::Fail, 0);
    }
    node.claim("x1", ClaimKind::agent_reset())
        .await
        .expect("claim");
    // It keeps trying at each tick until its deadline, then uninstalls anyway.
    node.clock.advance_secs(2);
    node.feed(Input::Tick).await.expect("a retry");
    assert!(matches!(state(&mut node), NodeState::Resetting { .. }));
    node.clock.advance_secs(600);
    node.feed(Input::Tick).await.expect("the deadline");
    assert!(matches!(state(&mut node), NodeState::Unjoined { .. }));
    assert!(results_for(&node, "x1").is_empty());
    let waiting = node
        .runner()
        .expect("open")
        .store()
        .unpublished()
        .expect("outbox");
    assert_eq!(waiting.len(), 1);
    // The API returns; the next daemon publishes what waited.
    node.host.world().faults.clear();
    node.stop_process();
    node.join(InstallMode::Host, "edge-07")
        .await
        .expect("re-join");
    node.boot().await.expect("daemon");
    assert_eq!(results_for(&node, "x1")[0].0, ResultReason::Succeeded);
}

#[tokio::test]
async fn deletion_signal_resets_the_node() {
    use flexnode::lifecycle::input::{GoalObservation, MachineObservation, NodeObservation};
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.feed(Input::GoalObserved(GoalObservation {
        node: NodeObservation::Present {
            deletion_taint: true,
        },
        machine: MachineObservation::Missing,
    }))
    .await
    .expect("observe");
    assert!(matches!(state(&mut node), NodeState::Unjoined { .. }));
    assert!(node.host.world().units.is_empty());
}

#[tokio::test]
async fn repave_rolls_back_when_the_new_side_fails_after_the_old_one_stopped() {
    use flexnode::lifecycle::input::{GoalObservation, MachineObservation, NodeObservation};
    use flexnode::lifecycle::state::Goal;
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host
        .world()
        .machines
        .entry(Side::Kube2)
        .or_default()
        .broken = true;
    let observe = |generation| {
        Input::GoalObserved(GoalObservation {
            node: NodeObservation::Absent,
            machine: MachineObservation::Present(Goal::new(generation, "v1.34.3")),
        })
    };
    node.feed(observe(2)).await.expect("observe");
    {
        let w = node.host.world();
        assert!(w.machines[&Side::Kube1].running, "old side is back");
        assert!(!w.machines[&Side::Kube2].running);
        assert!(w.machines[&Side::Kube1].enabled);
        assert!(
            !w.machines[&Side::Kube2].enabled,
            "the broken side would start again at the next boot"
        );
    }
    let st = state(&mut node);
    assert_eq!(st.node().map(|n| n.active), Some(Side::Kube1));
    // Fixed, the next observation repaves for real.
    node.host
        .world()
        .machines
        .entry(Side::Kube2)
        .or_default()
        .broken = false;
    node.feed(observe(2)).await.expect("observe");
    let st = state(&mut node);
    assert_eq!(
        st.node().map(|n| (n.active, n.applied.generation)),
        Some((Side::Kube2, 2))
    );
    assert!(
        node.host.world().machines[&Side::Kube1]
            .kubernetes_version
            .is_none()
    );
}

#[tokio::test]
async fn a_restart_that_never_comes_is_rolled_back_at_the_hand_off_deadline() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Host).await;
    node.host.serve_artifact(URL, SHA, v2(false));
    node.claim("u1", upgrade(URL, SHA)).await.expect("claim");
    assert!(node.runner().expect("open").restart_requested());
    // The timer never fires; the old daemon is still there when the deadline passes.
    node.host.world().restart_timers.clear();
    node.clock.advance_secs(400);
    node.feed(Input::Tick).await.expect("tick");
    assert_eq!(
        results_for(&node, "u1"),
        [(
            ResultReason::ExecutionFailed,
            "failed to restart upgraded agent daemon".to_string()
        )]
    );
    assert_eq!(
        node.host.world().current,
        Some(AgentBuild::Slot { slot: Slot::Blue })
    );
    assert!(!node.runner().expect("open").restart_requested());
}

#[tokio::test]
async fn a_rolled_back_image_is_removed_at_the_next_daemon_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, InstallMode::Container).await;
    node.host.serve_image(IMAGE, v2(true));
    node.claim("u1", upgrade("oci://registry.example/flexnode:v2", IMAGE))
        .await
        .expect("claim");
    node.settle().await.expect("recovery");
    assert_eq!(results_for(&node, "u1")[0].0, ResultReason::DaemonFailed);
    // The restored build's daemon judged the rollback, then removed what nothing runs again.
    assert!(!node.host.world().images.contains_key(IMAGE));
    let store = &node.runner().expect("open").store();
    assert!(!store.is_agent_image(IMAGE).expect("query"));
    assert!(store.agent_images().expect("list").is_empty());
}

#[tokio::test]
async fn join_turns_swap_off_for_good() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    {
        let mut w = node.host.world();
        w.fstab_swap = true;
        let swap = w.units.entry("swapfile.swap".into()).or_default();
        swap.active = true;
    }
    node.join(InstallMode::Container, "edge-07")
        .await
        .expect("join");
    let w = node.host.world();
    assert!(!w.fstab_swap, "the fstab's swap lines are commented out");
    let swap = &w.units["swapfile.swap"];
    assert!(!swap.active && swap.masked, "{swap:?}");
}

#[tokio::test]
async fn join_loads_the_kernel_modules_before_the_machine_starts() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    node.join(InstallMode::Host, "edge-08").await.expect("join");
    let w = node.host.world();
    assert!(w.kernel_modules);
    let at = |call: &str| w.calls.iter().position(|c| c == call);
    let loaded = at("load_kernel_modules()").expect("modules loaded");
    let started = at("start(systemd-nspawn@kube1.service)").expect("kube1 started");
    assert!(loaded < started, "{:?}", w.calls);
}
