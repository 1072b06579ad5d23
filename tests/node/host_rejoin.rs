//! A join started while an AgentReset is finishing: the operation reads `Complete` before the
//! agent has uninstalled itself, so an operator (or a controller) that joins again at once
//! used to install what the reset then removed, and the join failed 180 s later on an agent
//! whose binary was gone. The host install in a booted nspawn container against a real
//! kube-apiserver (support/hostnode.rs).

use crate::support;

use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode_test_tier::tier;
use kube::api::{Api, PostParams};
use std::time::Duration;
use support::agent::{admin, apply_rbac};
use support::hostnode::HostNode;
use support::{Lab, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn, controlplane)]
async fn a_join_during_a_reset_waits_for_it_then_joins_afresh() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let node = HostNode::join(
        &lab,
        &format!("fxrj-{}", std::process::id()),
        "rejoin-1",
        bin,
    );
    let ops: Api<MachineOperation> = Api::all(client.clone());
    let spec = MachineOperationSpec {
        machine_ref: Some("rejoin-1".into()),
        operation_kind: OperationKind::AgentReset,
        ..Default::default()
    };
    ops.create(
        &PostParams::default(),
        &MachineOperation::new("reset-1", spec),
    )
    .await
    .expect("create the AgentReset");
    // Claimed: from here until it has uninstalled itself (about a second), the agent holds
    // the store.
    let phase = wait_for(Duration::from_secs(60), || async {
        let phase = ops.get("reset-1").await.ok()?.status?.phase?;
        matches!(phase, OperationPhase::InProgress | OperationPhase::Complete).then_some(phase)
    })
    .await
    .expect("the AgentReset was not claimed within 60 s");

    let out = node
        .container
        .exec(&["/root/flexnode", "join", "--config", "/root/join.yaml"]);
    let text = format!(
        "after the reset was {phase:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the join failed {text}");
    assert!(
        text.contains("a reset is under way; waiting for it to finish"),
        "the join did not wait for the reset under way {text}"
    );
    let active = node
        .container
        .exec(&["systemctl", "is-active", "flexnode-agent"]);
    assert_eq!(
        String::from_utf8_lossy(&active.stdout).trim(),
        "active",
        "{text}"
    );
    let installed = node
        .container
        .exec(&["test", "-x", "/opt/flexnode/current/flexnode"]);
    assert!(
        installed.status.success(),
        "the reset removed the join's install {text}"
    );
    let status = ops
        .get("reset-1")
        .await
        .expect("read the AgentReset")
        .status
        .unwrap_or_default();
    assert_eq!(status.phase, Some(OperationPhase::Complete), "{status:?}");
}
