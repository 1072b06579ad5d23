//! The drain before a NodeReboot against a real control plane (kube-apiserver, the
//! controllers that keep PodDisruptionBudgets' status and ReplicaSets, the scheduler), the
//! agent with its own least-privilege identity and the host simulated. No kubelet runs here:
//! [`Kubelets`] reports the test's Nodes Ready and their pods Ready, and finishes the
//! deletion of an evicted pod, as a kubelet would (the native lab's suite has real ones,
//! `e2e/native/suite.py`).

use crate::daemon::machine_restarts;
use crate::support;

use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode::effects::kube::CORDON_MARK;
use flexnode::lifecycle::agent::InstallMode;
use flexnode_test_tier::tier;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::Lab;
use support::agent::{Agent, admin, apply_rbac, create_node_and_machine};

const NODE: &str = "edge-07";
const SPARES: [&str; 3] = ["spare-1", "spare-2", "spare-3"];

/// Plays the kubelets of the test's Nodes: heartbeats, pods Ready once bound, an evicted
/// pod's deletion finished (grace period 0) — and counts the web pods Ready throughout.
struct Kubelets {
    task: tokio::task::JoinHandle<()>,
    fewest_ready: std::sync::Arc<std::sync::Mutex<Option<usize>>>,
}

impl Kubelets {
    fn start(client: Client) -> Self {
        let fewest_ready = std::sync::Arc::new(std::sync::Mutex::new(None));
        let fewest = fewest_ready.clone();
        let task = tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client.clone());
            let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
            loop {
                for name in std::iter::once(NODE).chain(SPARES) {
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let room = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
                    let status = json!({"status": {
                        "capacity": room, "allocatable": room,
                        "conditions": [{
                            "type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test kubelet", "lastHeartbeatTime": now,
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
                    let _ = nodes
                        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    continue;
                };
                let mut ready = 0;
                for pod in &list.items {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                    if pod.metadata.deletion_timestamp.is_some() {
                        let _ = pods
                            .delete(&name, &DeleteParams::default().grace_period(0))
                            .await;
                        continue;
                    }
                    if bound.is_none() {
                        continue;
                    }
                    if is_ready(pod) {
                        ready += 1;
                        continue;
                    }
                    let status = json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "PodScheduled", "status": "True"}]}});
                    let _ = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
                {
                    let mut f = fewest.lock().expect("count");
                    // Counted from the first time all the replicas were Ready.
                    if f.is_some() || ready >= 2 {
                        *f = Some(f.map_or(ready, |f: usize| f.min(ready)));
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Self { task, fewest_ready }
    }

    fn fewest_ready(&self) -> Option<usize> {
        *self.fewest_ready.lock().expect("count")
    }
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn apply<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create")
}

async fn label_node(client: &Client, node: &str, pool: bool) {
    let patch = json!({"metadata": {"labels": {"pool": if pool { Some("web") } else { None }}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label");
}

fn reboot(name: &str, params: &[(&str, &str)]) -> MachineOperation {
    MachineOperation::new(
        name,
        MachineOperationSpec {
            machine_ref: Some(NODE.into()),
            operation_kind: OperationKind::NodeReboot,
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
    )
}

async fn wait_for<T>(what: &str, secs: u64, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn status(op: &MachineOperation) -> (Option<OperationPhase>, String) {
    let s = op.status.clone().unwrap_or_default();
    (s.phase, s.message.unwrap_or_default())
}

/// `(unschedulable, the drain's mark)`.
async fn cordon(client: &Client) -> (bool, Option<String>) {
    let node = Api::<Node>::all(client.clone())
        .get(NODE)
        .await
        .expect("node");
    (
        node.spec.and_then(|s| s.unschedulable) == Some(true),
        node.metadata
            .annotations
            .and_then(|a| a.get(CORDON_MARK).cloned()),
    )
}

/// The web pods and where each runs.
async fn web_pods(client: &Client) -> Vec<(String, Option<String>)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let list = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("pods");
    list.items
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
            )
        })
        .collect()
}

/// One control plane, in turn: a budget that is never met fails the NodeReboot at its drain
/// timeout, the node uncordoned and nothing restarted; a budget that holds the drain until a
/// replica is added, the agent killed meanwhile, resumes and completes with one restart once
/// the evicted replica's replacement is Ready elsewhere, the budget never broken; an
/// operator's cordon outlives a NodeReboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn node_reboots_drain_within_their_budgets() {
    let lab = Lab::up_with_controllers();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    create_node_and_machine(&client, NODE, &[("pool", "web")]).await;
    for spare in SPARES {
        let mut node = Node::default();
        node.metadata.name = Some(spare.into());
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("spare node");
    }
    label_node(&client, SPARES[0], true).await;
    let kubelets = Kubelets::start(client.clone());
    let mut agent = Agent::join(&lab, NODE, InstallMode::Host).await;

    // Two web replicas, one per `pool=web` node (edge-07 and spare-1), and a budget that
    // keeps both.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    apply(
        &deployments,
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "nodeSelector": {"pool": "web"},
                        "affinity": {"podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [{
                                "labelSelector": {"matchLabels": {"app": "web"}},
                                "topologyKey": "kubernetes.io/hostname"}]}},
                        // Not the cordon's taint: a cordoned node must take no replica.
                        "tolerations": [
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                            {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}],
                        "containers": [{"name": "web", "image": "registry.invalid/web:1"}]
                    }
                }
            }
        }),
    )
    .await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    apply(
        &budgets,
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
        }),
    )
    .await;
    wait_for("two web pods, one on edge-07", 60, async || {
        let pods = web_pods(&client).await;
        let on_node = pods.iter().any(|(_, n)| n.as_deref() == Some(NODE));
        (pods.len() == 2 && on_node && kubelets.fewest_ready() == Some(2)).then_some(())
    })
    .await;
    wait_for("the budget's status", 60, async || {
        let b = budgets.get("web").await.ok()?;
        let s = b.status?;
        (s.current_healthy == 2 && s.disruptions_allowed == 0).then_some(())
    })
    .await;
    let ops: Api<MachineOperation> = Api::all(client.clone());

    // A budget never met: the NodeReboot fails at its drain timeout, nothing restarted.
    ops.create(
        &PostParams::default(),
        &reboot("held", &[("drainTimeout", "5s")]),
    )
    .await
    .expect("create");
    let op = wait_for("held fails", 60, async || {
        ops.get("held")
            .await
            .ok()
            .filter(MachineOperation::is_terminal)
    })
    .await;
    let (phase, message) = status(&op);
    assert_eq!(phase, Some(OperationPhase::Failed), "{message}");
    assert!(
        message.starts_with("drain timed out after 5s: 1 pod left: default/web-")
            && message.ends_with("held by budget default/web"),
        "{message}"
    );
    assert_eq!(
        machine_restarts(&agent.host),
        0,
        "restarted after a failed drain"
    );
    assert_eq!(cordon(&client).await, (false, None), "left cordoned");

    // The budget holds the drain until a third replica is Ready elsewhere; the agent dies
    // meanwhile and its successor resumes the drain.
    ops.create(&PostParams::default(), &reboot("reboot-1", &[]))
        .await
        .expect("create");
    wait_for("the drain held by the budget", 60, async || {
        let op = ops.get("reboot-1").await.ok()?;
        status(&op)
            .1
            .contains("held by budget default/web")
            .then_some(())
    })
    .await;
    let uid = ops.get("reboot-1").await.expect("op").metadata.uid;
    assert_eq!(
        cordon(&client).await,
        (true, uid.map(|u| format!("operation/{u}"))),
        "cordoned with the drain's mark"
    );
    assert_eq!(
        machine_restarts(&agent.host),
        0,
        "restarted before the drain ended"
    );
    agent.restart().await;
    // Room for the third replica and for the evicted one's replacement: the drain waits
    // for the replacement to be Ready (the budget whole again) before the restart.
    label_node(&client, SPARES[1], true).await;
    label_node(&client, SPARES[2], true).await;
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scale");
    let op = wait_for("reboot-1 ends", 120, async || {
        ops.get("reboot-1")
            .await
            .ok()
            .filter(MachineOperation::is_terminal)
    })
    .await;
    assert_eq!(
        status(&op),
        (
            Some(OperationPhase::Complete),
            "NodeReboot completed".into()
        )
    );
    assert_eq!(
        machine_restarts(&agent.host),
        1,
        "one restart, after the drain"
    );
    assert_eq!(
        cordon(&client).await,
        (false, None),
        "the agent's cordon is lifted"
    );
    assert!(
        kubelets.fewest_ready().is_some_and(|f| f >= 2),
        "the budget was broken: {:?} web pods Ready at one point",
        kubelets.fewest_ready()
    );

    // An operator's cordon is theirs: the NodeReboot neither marks nor lifts it.
    Api::<Node>::all(client.clone())
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    ops.create(&PostParams::default(), &reboot("reboot-2", &[]))
        .await
        .expect("create");
    let op = wait_for("reboot-2 ends", 60, async || {
        ops.get("reboot-2")
            .await
            .ok()
            .filter(MachineOperation::is_terminal)
    })
    .await;
    assert_eq!(status(&op).0, Some(OperationPhase::Complete));
    assert_eq!(
        cordon(&client).await,
        (true, None),
        "the operator's cordon was lifted"
    );
    agent.kill().await;
}
