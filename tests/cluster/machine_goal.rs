//! The Machine's goal as the real daemon reads it from a real kube-apiserver: its labels and
//! taints become the goal a repave applies, and its `spec.agent.downloads` are said to be
//! ignored on the Machine (docs/node.md). The host underneath is simulated; the real kubelet's
//! side is the native suite's (e2e/native/goal.py).

use crate::support;

use flexnode::api::Machine;
use flexnode::effects::kube::DOWNLOADS_IGNORED;
use flexnode::lifecycle::NodeState;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::store::StoreReader;
use flexnode_test_tier::tier;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use std::time::Duration;
use support::Lab;
use support::agent::{Agent, admin, apply_rbac, create_node_and_machine};

async fn patch(machines: &Api<Machine>, name: &str, spec: serde_json::Value) {
    machines
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "spec": spec })),
        )
        .await
        .expect("patch the Machine");
}

/// A control plane with node `name`'s Node and Machine, and its agent joined and running.
async fn joined(name: &str) -> (Lab, kube::Client, Agent) {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    create_node_and_machine(&client, name, &[]).await;
    let agent = Agent::join(&lab, name, InstallMode::Host).await;
    (lab, client, agent)
}

async fn condition(machines: &Api<Machine>, name: &str, type_: &str) -> Option<Condition> {
    machines
        .get(name)
        .await
        .ok()?
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn the_machine_s_labels_and_taints_are_the_goal_a_repave_applies() {
    let (_lab, client, agent) = joined("edge-11").await;
    let machines: Api<Machine> = Api::all(client.clone());
    patch(
        &machines,
        "edge-11",
        serde_json::json!({"kubernetes": {
            "nodeLabels": {"flexnode.io/pool": "edge"},
            "registerWithTaints": ["dedicated=edge:NoSchedule"],
        }}),
    )
    .await;
    Api::<Node>::all(client.clone())
        .delete("edge-11", &DeleteParams::default())
        .await
        .expect("delete the Node");
    let applied = support::wait_for(Duration::from_secs(30), || async {
        let state = StoreReader::open(&agent.store).ok()?.load().ok()?.state;
        match state {
            NodeState::Ready { node } if node.applied.generation == 2 => Some(node.applied),
            _ => None,
        }
    })
    .await
    .expect("the new generation applied");
    assert_eq!(applied.node.labels["flexnode.io/pool"], "edge");
    assert_eq!(applied.node.taints, ["dedicated=edge:NoSchedule"]);
    let report = flexnode::status_report::build(&StoreReader::open(&agent.store).expect("reader"))
        .expect("report");
    let text = flexnode::status_report::render_human(&report);
    assert!(
        text.contains("Labels:           flexnode.io/pool=edge"),
        "{text}"
    );
    assert!(
        text.contains("Taints:           dedicated=edge:NoSchedule"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_machine_s_downloads_are_said_to_be_ignored() {
    let (_lab, client, _agent) = joined("edge-12").await;
    let machines: Api<Machine> = Api::all(client.clone());
    patch(
        &machines,
        "edge-12",
        serde_json::json!({"agent": {"downloads": {
            "kubernetes": {"version": "v1.34.3"},
            "runc": {"url": "https://downloads.example/runc.amd64"},
        }}}),
    )
    .await;
    let said = support::wait_for(Duration::from_secs(30), || async {
        condition(&machines, "edge-12", DOWNLOADS_IGNORED).await
    })
    .await
    .expect("the condition");
    assert_eq!(
        (said.status.as_str(), said.reason.as_str()),
        ("True", "NodeImage")
    );
    assert!(
        said.message
            .contains("spec.agent.downloads (kubernetes, runc) is ignored"),
        "{}",
        said.message
    );

    // No downloads named: the condition goes.
    patch(&machines, "edge-12", serde_json::json!({"agent": null})).await;
    let gone = support::wait_for(Duration::from_secs(30), || async {
        condition(&machines, "edge-12", DOWNLOADS_IGNORED)
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the condition stayed");
}
