//! A bad environment under the real agent unit: the host install joined in a booted nspawn
//! container (systemd 252 as PID 1, support/hostnode.rs) against a real kube-apiserver. For
//! each case the agent refuses to guess and says so on every channel: the unit's result and
//! exit status (78 is not restarted), systemd's `StatusText`, the journal (`reason=`), the
//! Machine's `NodeUpdated` condition and Event, and `flexnode status`; then the remedy it names
//! is applied and the agent runs again. A store newer than the build, damaged, emptied; the
//! configuration missing or garbled; `/etc` read-only and the store's filesystem full while
//! an operation waits (it runs once, when the environment is mended).

use crate::support;

use flexnode::api::Machine;
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode::store::migrations::SCHEMA_VERSION;
use flexnode_test_tier::tier;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::agent::{admin, apply_rbac};
use support::hostnode::HostNode;
use support::{Lab, wait_for};

const FLEXNODE: &str = "/opt/flexnode/bin/flexnode";
const NODE: &str = "badenv-1";

struct Case<'a> {
    node: &'a HostNode,
    client: &'a Client,
}

fn now_usec() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Case<'_> {
    fn run(&self, cmd: &[&str]) -> std::process::Output {
        self.node.container.exec(cmd)
    }

    fn ok(&self, cmd: &[&str]) {
        let out = self.run(cmd);
        assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    }

    /// A path in the container as the host reaches it.
    fn path(&self, p: &str) -> PathBuf {
        self.node.container.root().join(p.trim_start_matches('/'))
    }

    fn store(&self) -> PathBuf {
        self.path("/var/lib/flexnode/state.db")
    }

    fn show(&self) -> BTreeMap<String, String> {
        let out = self.run(&[
            "systemctl",
            "show",
            "-p",
            "ActiveState,SubState,Result,ExecMainStatus,NRestarts,StatusText",
            "flexnode-agent",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Remounts /etc in the running agent's mount namespace `ro` or `rw`.
    fn agent_etc(&self, mode: &str) {
        let out = self.run(&[
            "systemctl",
            "show",
            "-p",
            "MainPID",
            "--value",
            "flexnode-agent",
        ]);
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            pid.parse::<u32>().is_ok_and(|p| p > 0),
            "the agent's PID: {pid:?}"
        );
        let remount = format!("remount,bind,{mode}");
        self.ok(&["nsenter", "-t", &pid, "-m", "mount", "-o", &remount, "/etc"]);
    }

    fn stop(&self) {
        self.ok(&["systemctl", "stop", "flexnode-agent"]);
    }

    /// Starts the agent and waits for it (`Type=notify`: READY=1).
    fn start(&self) {
        self.ok(&["systemctl", "reset-failed", "flexnode-agent"]);
        self.ok(&["systemctl", "start", "flexnode-agent"]);
        assert_eq!(self.show()["ActiveState"], "active");
    }

    /// The agent refuses to start: exit 78, failed at once (no restart pending, none made),
    /// `StatusText` and the journal name `reason`. Returns the StatusText.
    fn refused(&self, reason: &str) -> String {
        let since = now_usec().saturating_sub(1_000_000);
        self.ok(&["systemctl", "reset-failed", "flexnode-agent"]);
        let out = self.run(&["systemctl", "start", "flexnode-agent"]);
        assert!(!out.status.success(), "the agent started: {}", text(&out));
        let show = self.show();
        assert_eq!(show["ExecMainStatus"], "78", "{show:?}");
        // Failed for good: a restart would be pending now (`auto-restart`).
        assert_eq!(
            (show["ActiveState"].as_str(), show["SubState"].as_str()),
            ("failed", "failed"),
            "{show:?}"
        );
        assert_eq!(show["NRestarts"], "0", "{show:?}");
        assert!(
            show["StatusText"].starts_with(&format!("{reason}: ")),
            "{show:?}"
        );
        let lines = self.node.journal(since);
        assert!(
            lines
                .iter()
                .any(|l| l.message.contains(&format!("reason={reason}"))
                    && l.message.contains("remedy=")),
            "no journal line with reason={reason}:\n{}",
            lines
                .iter()
                .map(|l| l.message.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
        show["StatusText"].clone()
    }

    /// `flexnode status` names the problem and what to do; its JSON carries it.
    fn status_names(&self, reason: &str, code: i32) {
        let out = self.run(&[FLEXNODE, "status"]);
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains(&format!("Problem:          {reason}: "))
                && shown.contains("What to do:"),
            "{shown}"
        );
        let out = self.run(&[FLEXNODE, "status", "-o", "json"]);
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
        let reasons: Vec<&str> = json["problems"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["reason"].as_str()).collect())
            .unwrap_or_default();
        assert!(reasons.contains(&reason), "{json}");
    }

    async fn machine(&self) -> (String, String, String) {
        let m = Api::<Machine>::all(self.client.clone())
            .get(NODE)
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

    /// The Machine shows `phase` and `NodeUpdated` with `reason`.
    async fn machine_shows(&self, phase: &str, reason: &str) {
        let shown = wait_for(Duration::from_secs(30), || async {
            let m = self.machine().await;
            (m.0 == phase && m.1 == reason).then_some(m)
        })
        .await;
        assert!(
            shown.is_some(),
            "the Machine shows {:?}, not {phase}/{reason}",
            self.machine().await
        );
    }

    /// How many Events about the Machine have `reason`.
    async fn machine_events(&self, reason: &str) -> usize {
        let list = Api::<Event>::all(self.client.clone())
            .list(&Default::default())
            .await
            .expect("events");
        list.items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some("Machine") && r.name.as_deref() == Some(NODE)
                    })
            })
            .count()
    }

    /// Waits for one more Event `reason` about the Machine than `before`.
    async fn machine_event(&self, reason: &str, before: usize) {
        let seen = wait_for(Duration::from_secs(30), || async {
            (self.machine_events(reason).await > before).then_some(())
        })
        .await;
        assert!(seen.is_some(), "no new {reason} Event for the Machine");
    }

    /// The fault reported on the Machine (phase Failed, its reason, a Warning Event).
    async fn machine_fault(&self, reason: &str, before: usize) {
        self.machine_shows("Failed", reason).await;
        self.machine_event(reason, before).await;
    }

    /// The fault is over on the Machine: Ready/Applied again, a `FaultCleared` Event.
    async fn machine_cleared(&self, before: usize) {
        self.machine_shows("Ready", "Applied").await;
        self.machine_event("FaultCleared", before).await;
    }

    async fn reboot(&self, name: &str) {
        Api::<MachineOperation>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &MachineOperation::new(
                    name,
                    MachineOperationSpec {
                        machine_ref: Some(NODE.into()),
                        operation_kind: OperationKind::NodeReboot,
                        ..Default::default()
                    },
                ),
            )
            .await
            .expect("create the NodeReboot");
    }

    async fn op(&self, name: &str, want: impl Fn(&MachineOperation) -> bool) -> MachineOperation {
        let api: Api<MachineOperation> = Api::all(self.client.clone());
        wait_for(Duration::from_secs(60), || async {
            api.get_opt(name).await.ok().flatten().filter(|op| want(op))
        })
        .await
        .unwrap_or_else(|| panic!("{name}: never got there"))
    }

    /// `name` waits as Pending, told `reason`, while the agent's STATUS names it too.
    async fn waits_for(&self, name: &str, reason: &str) {
        let op = self
            .op(name, |op| {
                op.status.as_ref().and_then(|s| s.phase) == Some(OperationPhase::Pending)
            })
            .await;
        let said = op.status.and_then(|s| s.message).unwrap_or_default();
        assert!(said.contains(reason), "{name}: {said}");
        let show = self.show();
        assert_eq!(show["ActiveState"], "active", "{show:?}");
        assert!(
            show["StatusText"].starts_with(&format!("{reason}: ")),
            "{show:?}"
        );
    }

    /// `name` finished once, `Complete`, and the Machine is back at `Ready`/`Applied`.
    async fn ran_once(&self, name: &str) {
        let op = self.op(name, MachineOperation::is_terminal).await;
        let s = op.status.expect("status");
        assert_eq!(s.phase, Some(OperationPhase::Complete), "{name}: {s:?}");
        assert_eq!(s.message.as_deref(), Some("NodeReboot completed"));
        let out = self.run(&[FLEXNODE, "history", "-o", "json", "--limit", "1000"]);
        let journal: serde_json::Value = serde_json::from_slice(&out.stdout).expect("history");
        let claims = journal["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .filter(|e| {
                e["input"]
                    .as_str()
                    .is_some_and(|i| i.contains("OperationClaimed") && i.contains(name))
            })
            .count();
        assert_eq!(claims, 1, "{name} claimed {claims} times");
    }
}

/// The store's schema version (`PRAGMA user_version`: header bytes 60..64, big-endian), set
/// in the file itself: SQLite would resolve `/proc/PID/root` to the host's own root. The agent
/// is stopped, so its WAL is checkpointed (empty).
fn set_schema(store: &Path, version: i64) {
    let wal = std::fs::metadata(store.with_extension("db-wal")).map_or(0, |m| m.len());
    assert_eq!(wal, 0, "a WAL with frames beside the store");
    let mut bytes = std::fs::read(store).expect("read the store");
    bytes[60..64].copy_from_slice(&u32::try_from(version).expect("a version").to_be_bytes());
    std::fs::write(store, bytes).expect("write the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn, controlplane)]
async fn a_bad_environment_is_refused_reported_and_mended() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    let bin = Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let node = HostNode::join(&lab, &format!("fxbe-{}", std::process::id()), NODE, bin);
    let c = Case {
        node: &node,
        client: &client,
    };
    let store = c.store();

    // A store a newer flexnode migrated: refused, never migrated back or started afresh.
    c.stop();
    let before = c.machine_events("StoreSchemaTooNew").await;
    set_schema(&store, SCHEMA_VERSION + 1);
    let said = c.refused("StoreSchemaTooNew");
    assert!(said.contains("newer flexnode"), "{said}");
    c.machine_fault("StoreSchemaTooNew", before).await;
    c.status_names("StoreSchemaTooNew", 1);
    // Remedy: the store this build knows again.
    set_schema(&store, SCHEMA_VERSION);
    let cleared = c.machine_events("FaultCleared").await;
    c.start();
    c.machine_cleared(cleared).await;

    // A damaged store: refused, by `join` too (78), and restored from a backup.
    c.stop();
    let backup = std::fs::read(&store).expect("back up the store");
    assert!(
        backup.len() >= 3 * 4096,
        "a store of {} bytes",
        backup.len()
    );
    let mut damaged = backup.clone();
    damaged[4096..3 * 4096].fill(0xa5);
    std::fs::write(&store, &damaged).expect("damage the store");
    let before = c.machine_events("StoreCorrupt").await;
    let said = c.refused("StoreCorrupt");
    assert!(
        said.contains("backup") && said.contains("flexnode reset --yes"),
        "{said}"
    );
    c.machine_fault("StoreCorrupt", before).await;
    c.status_names("StoreCorrupt", 1);
    for cmd in [
        &[FLEXNODE, "join", "--config", "/root/join.yaml"][..],
        &[FLEXNODE, "recover-agent-upgrade"][..],
    ] {
        let out = c.run(cmd);
        assert_eq!(out.status.code(), Some(78), "{cmd:?}: {}", text(&out));
        assert!(
            text(&out).contains("StoreCorrupt"),
            "{cmd:?}: {}",
            text(&out)
        );
    }
    assert_eq!(
        std::fs::read(&store).expect("the store"),
        damaged,
        "the store was touched"
    );
    std::fs::write(&store, &backup).expect("restore the backup");
    let cleared = c.machine_events("FaultCleared").await;
    c.start();
    c.machine_cleared(cleared).await;

    // A store truncated to nothing is damage, not a new node: refused; `reset` sets it aside
    // and a re-join starts over.
    c.stop();
    std::fs::write(&store, b"").expect("empty the store");
    let before = c.machine_events("StoreCorrupt").await;
    c.refused("StoreCorrupt");
    c.machine_fault("StoreCorrupt", before).await;
    c.ok(&[FLEXNODE, "reset", "--yes"]);
    let aside: Vec<String> = std::fs::read_dir(c.path("/var/lib/flexnode"))
        .expect("the store's directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("state.db.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "set aside: {aside:?}");
    assert!(
        !c.path("/etc/systemd/system/flexnode-agent.service")
            .exists()
    );
    assert!(!c.path("/opt/flexnode/current").exists());
    let join = c.run(&["/root/flexnode", "join", "--config", "/root/join.yaml"]);
    assert!(join.status.success(), "re-join: {}", text(&join));
    c.machine_shows("Ready", "Applied").await;
    assert_eq!(c.show()["ActiveState"], "active");

    // The store gone from an installed host (a filesystem not mounted): never started afresh.
    c.stop();
    let away = c.path("/var/lib/flexnode/state.db.away");
    std::fs::rename(&store, &away).expect("move the store away");
    let before = c.machine_events("StoreMissing").await;
    c.refused("StoreMissing");
    c.machine_fault("StoreMissing", before).await;
    c.status_names("StoreMissing", 2);
    let join = c.run(&[FLEXNODE, "join", "--config", "/root/join.yaml"]);
    assert_eq!(join.status.code(), Some(78), "{}", text(&join));
    assert!(text(&join).contains("StoreMissing"), "{}", text(&join));
    assert!(!store.exists(), "a store was made");
    std::fs::rename(&away, &store).expect("put it back");
    let cleared = c.machine_events("FaultCleared").await;
    c.start();
    c.machine_cleared(cleared).await;

    // The configuration missing, then garbled: 78, said in STATUS and the journal (without a
    // credential the Machine cannot be told); `flexnode status` names it.
    let config = c.path("/etc/flexnode/config.yaml");
    let kept = std::fs::read(&config).expect("the installed config");
    c.stop();
    std::fs::remove_file(&config).expect("remove the config");
    c.refused("ConfigMissing");
    c.status_names("ConfigMissing", 0);
    std::fs::write(&config, [0xff, 0xfe, 0x00, 0x01]).expect("garble the config");
    c.refused("ConfigUnreadable");
    std::fs::write(&config, &kept).expect("restore the config");
    c.start();

    // /etc read-only: a NodeReboot waits (Pending, told why), runs once /etc is writable. The
    // agent's sandbox gives it a mount of /etc of its own (`ReadWritePaths=`), which a
    // read-only bind in the host's namespace does not reach (the agent could still write), so
    // both views are made read-only: the host's for `join` and `status`, the agent's for it.
    c.ok(&["mount", "--bind", "/etc", "/etc"]);
    c.ok(&["mount", "-o", "remount,bind,ro", "/etc"]);
    c.agent_etc("ro");
    let before = c.machine_events("EtcReadOnly").await;
    c.reboot("reboot-etc").await;
    c.machine_fault("EtcReadOnly", before).await;
    c.waits_for("reboot-etc", "EtcReadOnly").await;
    c.status_names("EtcReadOnly", 0);
    let join = c.run(&[FLEXNODE, "join", "--config", "/root/join.yaml"]);
    assert_eq!(join.status.code(), Some(1), "{}", text(&join));
    assert!(
        text(&join).contains("preflight: EtcReadOnly"),
        "{}",
        text(&join)
    );
    let cleared = c.machine_events("FaultCleared").await;
    c.ok(&["umount", "/etc"]);
    c.agent_etc("rw");
    c.ran_once("reboot-etc").await;
    c.machine_cleared(cleared).await;

    // The store's filesystem full: the same, resumed when space returns; the store intact.
    c.stop();
    c.ok(&["cp", "-a", "/var/lib/flexnode", "/run/flexnode-state"]);
    c.ok(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=2m,mode=0700",
        "tmpfs",
        "/var/lib/flexnode",
    ]);
    c.ok(&["cp", "-a", "/run/flexnode-state/.", "/var/lib/flexnode/"]);
    c.start();
    let filler = c.path("/var/lib/flexnode/filler");
    let fill = c.run(&[
        "dd",
        "if=/dev/zero",
        "of=/var/lib/flexnode/filler",
        "bs=64k",
    ]);
    assert!(
        String::from_utf8_lossy(&fill.stderr).contains("No space left"),
        "{}",
        text(&fill)
    );
    let before = c.machine_events("DiskFull").await;
    c.reboot("reboot-full").await;
    c.machine_fault("DiskFull", before).await;
    c.waits_for("reboot-full", "DiskFull").await;
    c.status_names("DiskFull", 0);
    let join = c.run(&[FLEXNODE, "join", "--config", "/root/join.yaml"]);
    assert_eq!(join.status.code(), Some(1), "{}", text(&join));
    assert!(
        text(&join).contains("preflight: DiskFull"),
        "{}",
        text(&join)
    );
    let cleared = c.machine_events("FaultCleared").await;
    std::fs::remove_file(&filler).expect("free the space");
    c.ran_once("reboot-full").await;
    c.machine_cleared(cleared).await;
    let check = c.run(&[FLEXNODE, "status", "-o", "json"]);
    assert!(check.status.success(), "{}", text(&check));
}
