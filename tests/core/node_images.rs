//! Which node image a machine is provisioned from, on the simulated host: the `nodeImage`
//! pattern resolved once and recorded before the pull, the same bytes for the same version,
//! pins first, and a goal that cannot be built refused before the running side is touched.
//! The real registry's side (a tag resolved over TLS with auth) is in
//! `tests/effects/containerd/pull.rs`; a real fleet's in the native suite (e2e/native/suite.py).

use flexnode::config::{NodeImage, NodeImagePattern, NodeImages};
use flexnode::lifecycle::NodeState;
use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::agent::{ImageRef, InstallMode, Sha256Hex};
use flexnode::lifecycle::input::{GoalObservation, Input, MachineObservation, NodeObservation};
use flexnode::lifecycle::state::{Goal, NodeSettings, Side};
use flexnode::sim::{ApiWrite, Build, GOAL_VERSION, SimNode};
use flexnode::store::StoreReader;

const T0: Timestamp = Timestamp::from_millis(1_700_000_000_000);
const FIRST: &str = "c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1";
const MOVED: &str = "c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2";
const NEXT: &str = "c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3";
const PINNED: &str = "c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4";
const NEXT_VERSION: &str = "v1.34.3";

fn build() -> Build {
    Build {
        version: "0.1.0".into(),
        crashes: false,
    }
}

fn pattern() -> NodeImages {
    NodeImages {
        pins: Default::default(),
        pattern: Some(
            NodeImagePattern::parse("oci://registry.example/node:{kubernetesVersion}")
                .expect("pattern"),
        ),
        archive: None,
    }
}

/// Joined with the pattern alone; the registry tags the goal's version as FIRST and the next
/// version as NEXT.
async fn joined(dir: &tempfile::TempDir, images: NodeImages) -> SimNode {
    let mut node = SimNode::new(&dir.path().join("state/state.db"), T0);
    for digest in [FIRST, MOVED, NEXT, PINNED] {
        node.host.serve_image(digest, build());
    }
    node.host
        .tag_image(&format!("registry.example/node:{GOAL_VERSION}"), FIRST);
    node.host
        .tag_image(&format!("registry.example/node:{NEXT_VERSION}"), NEXT);
    node.node_images = images;
    node.join(InstallMode::Host, "edge-07").await.expect("join");
    node.boot().await.expect("daemon starts");
    node
}

fn goal(generation: i64, version: &str, labels: &[(&str, &str)]) -> Input {
    Input::GoalObserved(GoalObservation {
        node: NodeObservation::Absent,
        machine: MachineObservation::Present(Goal {
            node: NodeSettings {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                taints: vec!["dedicated=edge:NoSchedule".into()],
            },
            ..Goal::new(generation, version)
        }),
    })
}

fn chosen(node: &SimNode, side: Side) -> (String, String) {
    let image = StoreReader::open(&node.path)
        .expect("reader")
        .machine_image(side)
        .expect("read")
        .expect("an image chosen");
    (image.reference, image.digest)
}

fn unpacked(node: &SimNode, side: Side) -> Option<String> {
    node.host
        .world()
        .machines
        .get(&side)
        .and_then(|m| m.image.clone())
}

fn applied(node: &mut SimNode) -> Goal {
    match node.runner().expect("runner").state().expect("state") {
        NodeState::Ready { node } => node.applied,
        other => panic!("not at rest: {other}"),
    }
}

fn last_machine_message(node: &SimNode) -> String {
    node.host
        .world()
        .api
        .iter()
        .rev()
        .find_map(|w| match w {
            ApiWrite::Machine { message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_version_is_resolved_through_the_pattern_and_a_moved_tag_changes_no_node() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, pattern()).await;
    assert_eq!(
        chosen(&node, Side::Kube1),
        (
            format!("registry.example/node:{GOAL_VERSION}@sha256:{FIRST}"),
            FIRST.to_string()
        ),
        "the tag resolved and recorded with the join's goal"
    );
    assert_eq!(unpacked(&node, Side::Kube1).as_deref(), Some(FIRST));
    let report = flexnode::status_report::build(&StoreReader::open(&node.path).expect("reader"))
        .expect("report");
    let shown = report
        .node
        .and_then(|n| n.node_image)
        .expect("status shows it");
    assert!(shown.ends_with(FIRST), "{shown}");

    // The tag moves; the Machine's labels change at the same version: the new side gets the
    // bytes the node already runs, and the Node's labels and taints become the goal's.
    node.host
        .tag_image(&format!("registry.example/node:{GOAL_VERSION}"), MOVED);
    let resolutions = |node: &SimNode| {
        node.host
            .world()
            .calls
            .iter()
            .filter(|c| c.starts_with("resolve_tag"))
            .count()
    };
    let before = resolutions(&node);
    node.feed(goal(2, GOAL_VERSION, &[("team", "blue")]))
        .await
        .expect("repave");
    assert_eq!(resolutions(&node), before, "nothing resolved");
    assert_eq!(unpacked(&node, Side::Kube2).as_deref(), Some(FIRST));
    assert_eq!(chosen(&node, Side::Kube2).1, FIRST);
    let applied_goal = applied(&mut node);
    assert_eq!(applied_goal.generation, 2);
    assert_eq!(applied_goal.node.labels["team"], "blue");
    assert_eq!(applied_goal.node.taints, ["dedicated=edge:NoSchedule"]);

    // A new version resolves its own tag.
    node.feed(goal(3, NEXT_VERSION, &[("team", "blue")]))
        .await
        .expect("repave");
    assert_eq!(unpacked(&node, Side::Kube1).as_deref(), Some(NEXT));
    assert_eq!(applied(&mut node).kubernetes_version, NEXT_VERSION);
}

#[tokio::test]
async fn a_provisioning_cut_short_resumes_with_the_image_it_chose() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, pattern()).await;
    // The pull fails once the tag is resolved and recorded; the tag moves before the retry.
    node.host.inject("pull", flexnode::sim::FaultKind::Fail, 0);
    node.feed(goal(2, NEXT_VERSION, &[]))
        .await
        .expect("observe");
    assert_eq!(
        chosen(&node, Side::Kube2).1,
        NEXT,
        "recorded before the pull"
    );
    node.host
        .tag_image(&format!("registry.example/node:{NEXT_VERSION}"), MOVED);
    node.feed(goal(2, NEXT_VERSION, &[])).await.expect("again");
    assert_eq!(
        unpacked(&node, Side::Kube2).as_deref(),
        Some(NEXT),
        "the same goal, the same bytes"
    );
    assert_eq!(applied(&mut node).generation, 2);
}

#[tokio::test]
async fn a_pin_wins_over_the_pattern() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut images = pattern();
    images.pins.insert(
        GOAL_VERSION.to_string(),
        NodeImage {
            image: ImageRef {
                registry: "registry.example".into(),
                repository: "pinned".into(),
                tag: None,
            },
            digest: Sha256Hex::parse(PINNED).expect("digest"),
        },
    );
    let node = joined(&dir, images).await;
    assert_eq!(
        chosen(&node, Side::Kube1).0,
        format!("registry.example/pinned@sha256:{PINNED}")
    );
    assert_eq!(unpacked(&node, Side::Kube1).as_deref(), Some(PINNED));
}

#[tokio::test]
async fn a_goal_that_cannot_be_built_fails_before_the_running_side_is_touched() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut node = joined(&dir, pattern()).await;
    let started = node.host.world().machines[&Side::Kube1].started_at;
    for (input, expect) in [
        (
            goal(2, "v1.99.0", &[]),
            "no node image for Kubernetes v1.99.0: image registry.example/node:v1.99.0: not found",
        ),
        (
            goal(3, GOAL_VERSION, &[("node-role.kubernetes.io/worker", "")]),
            "the Machine's spec.kubernetes.nodeLabels: a kubelet may not set",
        ),
    ] {
        let calls = node.host.world().calls.len();
        node.feed(input).await.expect("observe");
        let message = last_machine_message(&node);
        assert!(message.contains(expect), "{message}");
        let w = node.host.world();
        let kube1 = &w.machines[&Side::Kube1];
        assert!(
            kube1.running && kube1.started_at == started,
            "kube1 untouched"
        );
        let since: Vec<&String> = w.calls[calls..].iter().collect();
        assert!(
            !since
                .iter()
                .any(|c| c.starts_with("pull") || c.starts_with("stop")),
            "nothing pulled or stopped: {since:?}"
        );
    }
    assert_eq!(applied(&mut node).generation, 1);
}
