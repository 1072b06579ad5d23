//! An AgentUpgrade's hand-off on a real systemd at native speed: the host install joined in a
//! booted nspawn container (support/hostnode.rs) against a real kube-apiserver, upgraded
//! twice (blue → green → blue) from an archive on loopback HTTP. The QEMU host suite checks
//! the same on a real kernel and boot; this one runs in seconds.

use crate::support;

use flexnode::api::MachineOperation;
use flexnode_test_tier::tier;
use kube::api::Api;
use support::Lab;
use support::agent::{admin, apply_rbac};
use support::artifacts::{Served, pack};
use support::hostnode::HostNode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn, controlplane)]
async fn agent_upgrades_hand_off_to_the_new_daemon_once_each() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let served = tempfile::tempdir().expect("a directory to serve");
    let (archive, sha) = pack(served.path(), "agent", bin);
    let server = Served::dir(served.path());
    let node = HostNode::join(
        &lab,
        &format!("fxho-{}", std::process::id()),
        "handoff-1",
        bin,
    );

    let url = server.url(&archive);
    let first = node.upgrade(&client, "upgrade-1", &url, &sha).await;
    let second = node.upgrade(&client, "upgrade-2", &url, &sha).await;
    assert_eq!(first.from_build, "slot blue", "{first:?}");
    assert_eq!(first.to_build, "slot green", "{first:?}");
    assert_eq!(second.from_build, "slot green", "{second:?}");
    assert_eq!(second.to_build, "slot blue", "{second:?}");

    // One restart per upgrade: nothing between the first's and the second's claims but the
    // first's own stop and start, and nothing after the second's.
    let starts = |from: u64, to: u64| {
        node.journal(first.claim)
            .iter()
            .filter(|l| l.usec >= from && l.usec < to)
            .filter(|l| l.message.starts_with("Started flexnode-agent.service"))
            .count()
    };
    assert_eq!(
        starts(first.claim, second.claim),
        1,
        "restarts in upgrade-1"
    );
    assert_eq!(starts(second.claim, u64::MAX), 1, "restarts in upgrade-2");

    let ops: Api<MachineOperation> = Api::all(client.clone());
    for name in ["upgrade-1", "upgrade-2"] {
        let status = ops.get(name).await.expect("get").status.unwrap_or_default();
        assert_eq!(
            status.message.as_deref(),
            Some("AgentUpgrade completed"),
            "{name}: {status:?}"
        );
    }
    // The journal holds each transition's operation as fields (src/log.rs), from both
    // daemons: the old one's claim and the new one's judgement.
    let uid = ops.get("upgrade-1").await.expect("get").metadata.uid;
    let entries = node.journal_entries(&["FLEXNODE_OPERATION=upgrade-1"]);
    let claim = entries
        .iter()
        .find(|e| {
            e["FLEXNODE_INPUT"]
                .as_str()
                .is_some_and(|i| i.starts_with("OperationClaimed("))
        })
        .unwrap_or_else(|| panic!("no claim among upgrade-1's journal entries: {entries:?}"));
    assert_eq!(
        claim["FLEXNODE_OPERATION_UID"].as_str(),
        uid.as_deref(),
        "{claim}"
    );
    assert_eq!(claim["FLEXNODE_KIND"], "AgentUpgrade", "{claim}");
    assert_eq!(claim["FLEXNODE_PHASE"], "Upgrading", "{claim}");
    assert_eq!(
        claim["FLEXNODE_TRANSITION"], "Ready --OperationClaimed--> Upgrading_Staging",
        "{claim}"
    );
    assert_eq!(claim["_SYSTEMD_UNIT"], "flexnode-agent.service", "{claim}");
    assert_eq!(claim["SYSLOG_IDENTIFIER"], "flexnode", "{claim}");
    assert_eq!(claim["PRIORITY"], "6", "{claim}");
    let message = claim["MESSAGE"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("transition from=Ready") && message.contains("operation=upgrade-1"),
        "the text keeps its fields: {claim}"
    );
    let pids: std::collections::BTreeSet<_> =
        entries.iter().filter_map(|e| e["_PID"].as_str()).collect();
    assert!(pids.len() >= 2, "both daemons name upgrade-1: {entries:?}");

    // The daemon's own account agrees.
    let out = node
        .container
        .exec(&["/opt/flexnode/bin/flexnode", "status", "-o", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    assert_eq!(status["lastResult"]["operation"], "upgrade-2", "{status}");
    assert_eq!(status["lastResult"]["reason"], "Succeeded", "{status}");
}
