//! The status publisher against a real kube-apiserver, under the agent's own identity: a write
//! starts from the copy of the operation the node last saw or wrote, saving the read, and a
//! stale copy or one of a replaced object is never what decides. The reads are counted from
//! the API server's audit log. A request lost on its way is sent again, a few times.

use crate::support;
use flexnode_test_tier::tier;

use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::OperationPhase;
use flexnode::effects::Publisher;
use flexnode::effects::kube::{KubePublisher, MSG_GONE, RESENDS};
use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::result::{OpResult, ResultReason};
use flexnode::lifecycle::state::OpRef;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use support::Lab;
use support::agent::{admin, agent_client, apply_rbac, create_node_and_machine, node_reboot};
use support::lossy::LossyRelay;

const NODE: &str = "pub-0";
const T: Timestamp = Timestamp::from_millis(1_785_578_400_000);

/// The agent's reads of MachineOperations so far, from the audit log.
fn reads(lab: &Lab) -> u64 {
    let by = lab.audited(&format!("system:flexnode:{NODE}"), 0);
    by.get("get machineoperations").copied().unwrap_or(0)
}

async fn create(api: &Api<MachineOperation>, name: &str) -> (MachineOperation, OpRef) {
    let op = api
        .create(&PostParams::default(), &node_reboot(name, NODE))
        .await
        .expect("create");
    let r = OpRef {
        name: name.into(),
        uid: op.metadata.uid.clone().expect("uid"),
    };
    (op, r)
}

/// The operation's phase as the API server has it.
async fn phase(api: &Api<MachineOperation>, name: &str) -> Option<OperationPhase> {
    api.get(name)
        .await
        .expect("get")
        .status
        .and_then(|s| s.phase)
}

fn done() -> OpResult {
    OpResult {
        reason: ResultReason::Succeeded,
        message: "rebooted".into(),
        started_at: T,
        machine_generation: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn writes_start_from_the_known_copy_and_a_stale_or_replaced_one_is_read_afresh() {
    let lab = Lab::up_audited();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    create_node_and_machine(&admin, NODE, &[]).await;
    let publisher = KubePublisher::new(agent_client(&lab, NODE).await, NODE);
    let ops: Api<MachineOperation> = Api::all(admin.clone());

    // As claimed from the watch: the claim and the result are written without a read.
    let (watched, a) = create(&ops, "op-a").await;
    publisher.remember(&watched);
    let before = reads(&lab);
    publisher
        .report_progress(&a, "restarting", 0, T)
        .await
        .expect("progress");
    publisher
        .publish_result(&a, &done(), T.plus_secs(5))
        .await
        .expect("result");
    assert_eq!(reads(&lab) - before, 0, "a known copy saves the reads");
    assert_eq!(phase(&ops, "op-a").await, Some(OperationPhase::Complete));

    // Someone else changed the object after the claim: the write with the stale copy is
    // refused by its resourceVersion, read afresh, and keeps the other change.
    let (watched, b) = create(&ops, "op-b").await;
    publisher.remember(&watched);
    let label = serde_json::json!({"metadata": {"labels": {"team": "edge"}}});
    ops.patch("op-b", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("label");
    let before = reads(&lab);
    publisher
        .report_progress(&b, "restarting", 0, T)
        .await
        .expect("progress");
    assert_eq!(reads(&lab) - before, 1, "one read after the conflict");
    let now = ops.get("op-b").await.expect("get");
    assert_eq!(
        now.status.and_then(|s| s.phase),
        Some(OperationPhase::InProgress)
    );
    assert_eq!(
        now.metadata
            .labels
            .unwrap_or_default()
            .get("team")
            .map(String::as_str),
        Some("edge")
    );

    // The object was replaced under the same name: the old copy says nothing is to be
    // written, so the object is read, and the new one is left alone.
    let (watched, c) = create(&ops, "op-c").await;
    publisher.remember(&watched);
    ops.delete("op-c", &DeleteParams::default())
        .await
        .expect("delete");
    let (_, replaced) = create(&ops, "op-c").await;
    let before = reads(&lab);
    let err = publisher
        .report_progress(&c, "restarting", 0, T)
        .await
        .expect_err("the claimed object is gone");
    assert!(err.to_string().contains(MSG_GONE), "{err}");
    assert_eq!(
        reads(&lab) - before,
        1,
        "the copy's skip is confirmed by a read"
    );
    let now = ops.get("op-c").await.expect("get");
    assert_eq!(now.metadata.uid.as_deref(), Some(replaced.uid.as_str()));
    assert_eq!(now.status.and_then(|s| s.phase), None);
}

/// The agent's client for `node`, through `relay` to the lab's API server.
async fn client_through(lab: &Lab, node: &str) -> (kube::Client, LossyRelay) {
    let kubeconfig = kube::config::Kubeconfig::read_from(lab.node_kubeconfig(node)).expect("read");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("kubeconfig");
    let server = config.cluster_url.authority().expect("authority").as_str();
    let relay = LossyRelay::start(server.parse().expect("host:port")).await;
    config.cluster_url = format!("https://{}", relay.addr).parse().expect("url");
    // A held request times out in this test's time, not kube's 295 s.
    config.read_timeout = Some(std::time::Duration::from_secs(10));
    (kube::Client::try_from(config).expect("client"), relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_status_write_lost_on_its_way_is_sent_again_a_few_times() {
    let lab = Lab::up_audited();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    create_node_and_machine(&admin, NODE, &[]).await;
    let (client, relay) = client_through(&lab, NODE).await;
    let publisher = KubePublisher::new(client, NODE);
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    let user = format!("system:flexnode:{NODE}");

    // A kept-alive connection, closed as the write goes out on it (CI's agent-reset failed
    // like this): the write is sent again and lands once.
    publisher.node_seen().await.expect("a pooled connection");
    assert_eq!(relay.accepted(), 1);
    let (watched, a) = create(&ops, "op-lost").await;
    publisher.remember(&watched);
    let from = lab.audit_len();
    relay.lose(1);
    publisher
        .report_progress(&a, "restarting", 0, T)
        .await
        .expect("progress after one lost request");
    assert_eq!(
        relay.lost(),
        1,
        "the relay lost nothing: the test proves nothing"
    );
    assert_eq!(
        relay.accepted(),
        2,
        "the write was lost on the kept-alive connection, and sent again on a new one"
    );
    assert_eq!(
        phase(&ops, "op-lost").await,
        Some(OperationPhase::InProgress)
    );
    let writes = lab
        .audited(&user, from)
        .get("update machineoperations")
        .copied();
    assert_eq!(writes, Some(1), "one status write reached the API server");

    // Lost every time: the write fails after its resends, with the transport's words, and
    // the operation keeps its last status (the outbox tries the result again later).
    relay.lose(RESENDS + 1);
    let err = publisher
        .publish_result(&a, &done(), T.plus_secs(5))
        .await
        .expect_err("every attempt lost");
    assert!(err.to_string().starts_with("API server: "), "{err}");
    assert_eq!(
        relay.lost(),
        1 + RESENDS + 1,
        "one attempt and {RESENDS} resends"
    );
    assert_eq!(
        phase(&ops, "op-lost").await,
        Some(OperationPhase::InProgress)
    );

    publisher
        .publish_result(&a, &done(), T.plus_secs(5))
        .await
        .expect("result once nothing is lost");
    assert_eq!(phase(&ops, "op-lost").await, Some(OperationPhase::Complete));

    // A server that hangs is not asked again: each attempt would wait out the read timeout.
    let (watched, b) = create(&ops, "op-held").await;
    publisher.remember(&watched);
    relay.hold(1 + RESENDS);
    let err = publisher
        .report_progress(&b, "restarting", 0, T)
        .await
        .expect_err("no answer");
    assert!(err.to_string().starts_with("API server: "), "{err}");
    assert_eq!(relay.held(), 1, "a request that timed out was sent again");
}
