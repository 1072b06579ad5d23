//! The agent's RBAC (`manifests/rbac/agent-rbac.yaml`) and per-node admission policies
//! (`manifests/rbac/agent-admission-policy.yaml`) against a real kube-apiserver 1.34
//! (`e2e/controlplane/run`), with real node client certificates
//! (`system:flexnode:<node>`, group `flexnode:agents`). Skipped only with
//! FLEXNODE_SKIP_CONTROLPLANE=1.

use crate::support;

use flexnode_test_tier::tier;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::Lab;

pub(crate) const OPS_POLICY: &str =
    "ValidatingAdmissionPolicy 'flexnode-agent-own-machineoperations'";
const OPS_MESSAGE: &str = "flexnode agents may only write operations addressed to their own node";
const MACHINE_POLICY: &str = "ValidatingAdmissionPolicy 'flexnode-agent-own-machine'";
const MACHINE_MESSAGE: &str = "flexnode agents may only write the Machine of their own node";
const NODE_POLICY: &str = "ValidatingAdmissionPolicy 'flexnode-agent-own-node'";
pub(crate) const IN_PROGRESS: &str = r#"{"status":{"phase":"InProgress"}}"#;

/// The lab's kubectl with a node agent's client certificate.
/// kubectl as an agent: with its certificate, or any kubeconfig (an exec plugin's).
pub(crate) struct Agent {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Agent {
    fn new(lab: &Lab, node: &str) -> Self {
        Self::with(lab, lab.node_kubeconfig(node))
    }

    pub(crate) fn with(lab: &Lab, kubeconfig: PathBuf) -> Self {
        Self {
            kubectl: lab.bin().join("kubectl"),
            kubeconfig,
        }
    }

    /// (success, stdout + stderr)
    pub(crate) fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub(crate) fn patch_status(&self, kind: &str, name: &str, patch: &str) -> (bool, String) {
        self.kubectl(&[
            "patch",
            kind,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            patch,
            "-o",
            "jsonpath={.status.phase}",
        ])
    }
}

pub(crate) fn apply(lab: &Lab, path: &Path) {
    let (ok, out) = lab.kubectl(&["apply", "-f", &path.display().to_string()]);
    assert!(ok, "apply {}: {out}", path.display());
}

pub(crate) fn apply_yaml(lab: &Lab, file: &str, yaml: &str) {
    let path = lab.dir.join(file);
    std::fs::write(&path, yaml).expect("write manifest");
    apply(lab, &path);
}

pub(crate) fn op(name: &str, addressing: &str) -> String {
    format!(
        "apiVersion: unbounded-cloud.io/v1alpha3\nkind: MachineOperation\nmetadata:\n  name: {name}\nspec:\n  {addressing}\n  operationKind: NodeReboot\n---\n"
    )
}

fn machine(name: &str) -> String {
    format!(
        "apiVersion: unbounded-cloud.io/v1alpha3\nkind: Machine\nmetadata:\n  name: {name}\nspec: {{}}\n---\n"
    )
}

/// The phase as the admin reads it.
fn phase(lab: &Lab, kind: &str, name: &str) -> String {
    let (ok, out) = lab.kubectl(&["get", kind, name, "-o", "jsonpath={.status.phase}"]);
    assert!(ok, "{out}");
    out.trim().to_owned()
}

/// Retries `attempt` until it is refused by `policy` (a ValidatingAdmissionPolicy takes a
/// moment to be loaded after it is created); returns the refusal.
pub(crate) fn until_refused_by(
    policy: &str,
    mut attempt: impl FnMut() -> (bool, String),
) -> String {
    let start = Instant::now();
    loop {
        let (ok, out) = attempt();
        if !ok && out.contains(policy) {
            return out;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "not refused by {policy} after 30 s (success: {ok}): {out}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[tier(controlplane)]
#[test]
fn agents_write_only_their_own_node_s_operations_and_machine() {
    let lab = Lab::up();
    let started = Instant::now();
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/rbac");
    apply(&lab, &rbac.join("agent-rbac.yaml"));
    apply(&lab, &rbac.join("agent-admission-policy.yaml"));

    // Probes for waiting until both policies are in force, so that the checks below see them
    // from their first request (and a write that got in before is not mistaken for one of them).
    let mut objects = op("probe-node-b", "machineRef: node-b") + &machine("probe-node-b");
    for (name, addressing) in [
        ("reboot-node-a", "machineRef: node-a"),
        ("reboot-node-b", "machineRef: node-b"),
        ("retire-node-a", "machineRef: node-a"),
        (
            "reboot-flex-site",
            "machineSelector: {matchLabels: {site: flex}}",
        ),
    ] {
        objects += &op(name, addressing);
    }
    objects += &machine("node-a");
    objects += &machine("node-b");
    for node in ["node-a", "node-b"] {
        objects += &format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels: {{site: flex}}\n---\n"
        );
    }
    apply_yaml(&lab, "objects.yaml", &objects);

    let node_a = Agent::new(&lab, "node-a");
    let node_b = Agent::new(&lab, "node-b");
    let (ok, out) = node_a.kubectl(&["auth", "whoami", "-o", "jsonpath={.status.userInfo}"]);
    assert!(
        ok && out.contains(r#""username":"system:flexnode:node-a""#)
            && out.contains("flexnode:agents"),
        "{out}"
    );

    // Being refused by a policy also proves RBAC let the request through.
    let out = until_refused_by(OPS_POLICY, || {
        node_a.patch_status("mop", "probe-node-b", IN_PROGRESS)
    });
    assert!(out.contains(OPS_MESSAGE), "{out}");
    let out = until_refused_by(MACHINE_POLICY, || {
        node_a.patch_status("mach", "probe-node-b", r#"{"status":{"phase":"Ready"}}"#)
    });
    assert!(out.contains(MACHINE_MESSAGE), "{out}");
    // (`kubectl cordon` exits 0 on a refusal: a patch does not.)
    let out = until_refused_by(NODE_POLICY, || {
        node_a.kubectl(&[
            "patch",
            "node",
            "node-b",
            "--type=merge",
            "-p",
            r#"{"spec":{"unschedulable":true}}"#,
        ])
    });
    assert!(out.contains("may only write their own Node"), "{out}");
    let settle = started.elapsed();

    // Its own Node's cordon (a drain's), with the drain's mark: allowed. Its labels: refused.
    let (ok, out) = node_a.kubectl(&[
        "patch",
        "node",
        "node-a",
        "--type=merge",
        "-p",
        r#"{"metadata":{"annotations":{"flexnode.io/cordoned-by":"operation/x"}},"spec":{"unschedulable":true}}"#,
    ]);
    assert!(ok, "{out}");
    let (ok, out) = node_a.kubectl(&["uncordon", "node-a"]);
    assert!(ok, "{out}");
    let (ok, out) = node_a.kubectl(&["label", "node", "node-a", "site=elsewhere", "--overwrite"]);
    assert!(!ok && out.contains(NODE_POLICY), "{out}");
    // What a drain reads and asks: the pods on its Node, budgets, evictions.
    for args in [
        &["list", "pods"][..],
        &["create", "pods", "--subresource=eviction"][..],
        &["list", "poddisruptionbudgets.policy"][..],
    ] {
        let (_, out) = node_a.kubectl(&[&["auth", "can-i"][..], args, &["-A"][..]].concat());
        assert_eq!(out.trim(), "yes", "node-a cannot {args:?}");
    }

    // Reads: its own operations by field selector, Nodes.
    let (ok, out) = node_a.kubectl(&[
        "get",
        "mop",
        "--field-selector",
        "spec.machineRef=node-a",
        "-o",
        "name",
    ]);
    assert!(ok, "{out}");
    let mut names: Vec<&str> = out.lines().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "machineoperation.unbounded-cloud.io/reboot-node-a",
            "machineoperation.unbounded-cloud.io/retire-node-a"
        ]
    );
    let (ok, out) = node_a.kubectl(&["get", "nodes"]);
    assert!(ok, "{out}");

    // Status of its own operation: allowed, and written.
    let (ok, out) = node_a.patch_status("mop", "reboot-node-a", IN_PROGRESS);
    assert!(ok && out.trim() == "InProgress", "{out}");
    assert_eq!(phase(&lab, "mop", "reboot-node-a"), "InProgress");

    // Status of another node's operation: refused by the policy, with its message.
    let (ok, out) = node_a.patch_status("mop", "reboot-node-b", IN_PROGRESS);
    assert!(!ok, "node-a wrote node-b's operation: {out}");
    assert!(
        out.contains(OPS_POLICY)
            && out.contains(&format!(
                "{OPS_MESSAGE}: system:flexnode:node-a (node node-a) may not write MachineOperation reboot-node-b, which is addressed to node node-b"
            )),
        "{out}"
    );
    assert_eq!(phase(&lab, "mop", "reboot-node-b"), "");
    // ... which node-b's agent may write, and so may the admin (the policy is for agents only).
    let (ok, out) = node_b.patch_status("mop", "reboot-node-b", IN_PROGRESS);
    assert!(ok && out.trim() == "InProgress", "{out}");
    let (ok, out) = lab.kubectl(&[
        "patch",
        "mop",
        "probe-node-b",
        "--subresource=status",
        "--type=merge",
        "-p",
        IN_PROGRESS,
    ]);
    assert!(ok, "admin refused: {out}");

    // A selector-addressed operation: every agent may write its status (documented
    // limitation: a policy cannot read the Node's labels to evaluate the selector).
    let (ok, out) = node_a.patch_status("mop", "reboot-flex-site", IN_PROGRESS);
    assert!(ok && out.trim() == "InProgress", "{out}");

    // Spec of its own operation, and creating operations: RBAC forbids.
    let (ok, out) = node_a.kubectl(&[
        "patch",
        "mop",
        "reboot-node-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"machineRef":"node-b"}}"#,
    ]);
    assert!(!ok, "node-a changed a spec: {out}");
    assert!(
        out.contains(r#"User "system:flexnode:node-a" cannot patch resource "machineoperations" in API group "unbounded-cloud.io""#),
        "{out}"
    );
    let (ok, out) = lab.kubectl(&[
        "get",
        "mop",
        "reboot-node-a",
        "-o",
        "jsonpath={.spec.machineRef}",
    ]);
    assert!(ok && out.trim() == "node-a", "{out}");
    let path = lab.dir.join("agent-op.yaml");
    std::fs::write(&path, op("made-by-node-a", "machineRef: node-a")).expect("write");
    let (ok, out) = node_a.kubectl(&["create", "-f", &path.display().to_string()]);
    assert!(
        !ok && out.contains(r#"cannot create resource "machineoperations""#),
        "{out}"
    );

    // Delete (TTL): not another node's operation, its own yes.
    let (ok, out) = node_a.kubectl(&["delete", "mop", "reboot-node-b", "--wait=false"]);
    assert!(!ok, "node-a deleted node-b's operation: {out}");
    assert!(
        out.contains(OPS_POLICY)
            && out.contains(&format!(
                "{OPS_MESSAGE}: system:flexnode:node-a (node node-a) may not delete MachineOperation reboot-node-b, which is addressed to node node-b"
            )),
        "{out}"
    );
    let (ok, out) = lab.kubectl(&["get", "mop", "reboot-node-b", "-o", "name"]);
    assert!(ok, "node-b's operation is gone: {out}");
    let (ok, out) = node_a.kubectl(&["delete", "mop", "retire-node-a", "--wait=false"]);
    assert!(ok, "{out}");
    let (ok, out) = lab.kubectl(&["get", "mop", "retire-node-a"]);
    assert!(!ok && out.contains("NotFound"), "{out}");

    // Machines: status of its own only; never the spec.
    let (ok, out) = node_a.patch_status("mach", "node-a", r#"{"status":{"phase":"Ready"}}"#);
    assert!(ok && out.trim() == "Ready", "{out}");
    assert_eq!(phase(&lab, "mach", "node-a"), "Ready");
    let (ok, out) = node_a.patch_status("mach", "node-b", r#"{"status":{"phase":"Ready"}}"#);
    assert!(!ok, "node-a wrote Machine node-b: {out}");
    assert!(
        out.contains(MACHINE_POLICY)
            && out.contains(&format!(
                "{MACHINE_MESSAGE}: system:flexnode:node-a (node node-a) may not write Machine node-b"
            )),
        "{out}"
    );
    assert_eq!(phase(&lab, "mach", "node-b"), "");
    let (ok, out) = node_a.kubectl(&[
        "patch",
        "mach",
        "node-a",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"site":"flex"}}}"#,
    ]);
    assert!(
        !ok && out
            .contains(r#"cannot patch resource "machines" in API group "unbounded-cloud.io""#),
        "{out}"
    );

    // Events: the agent reports what it does.
    let event = lab.dir.join("event.yaml");
    std::fs::write(
        &event,
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: node-a.reboot\n  namespace: default\ninvolvedObject:\n  apiVersion: unbounded-cloud.io/v1alpha3\n  kind: MachineOperation\n  name: reboot-node-a\nreason: Started\nmessage: rebooting\ntype: Normal\nsource:\n  component: flexnode\n  host: node-a\n",
    )
    .expect("write");
    let (ok, out) = node_a.kubectl(&["create", "-f", &event.display().to_string()]);
    assert!(ok, "{out}");

    // Nothing else: secrets, Nodes beyond a cordon, pods beyond evictions.
    let (ok, out) = node_a.kubectl(&["get", "secrets", "-A"]);
    assert!(
        !ok && out.contains(r#"User "system:flexnode:node-a" cannot list resource "secrets""#),
        "{out}"
    );
    let (ok, out) = node_a.kubectl(&["get", "secret", "anything", "-n", "kube-system"]);
    assert!(
        !ok && out.contains(r#"cannot get resource "secrets""#),
        "{out}"
    );
    for (verb, resource) in [
        ("get", "secrets"),
        ("watch", "secrets"),
        ("create", "machineoperations.unbounded-cloud.io"),
        ("update", "machineoperations.unbounded-cloud.io"),
        ("update", "machines.unbounded-cloud.io"),
        ("delete", "machines.unbounded-cloud.io"),
        ("deletecollection", "machineoperations.unbounded-cloud.io"),
        ("update", "nodes"),
        ("delete", "nodes"),
        ("create", "pods"),
        ("delete", "pods"),
        ("get", "pods"),
        ("delete", "events"),
        ("get", "configmaps"),
    ] {
        let (_, out) = node_a.kubectl(&["auth", "can-i", verb, resource, "-A"]);
        assert_eq!(out.trim(), "no", "node-a can {verb} {resource}");
    }

    eprintln!(
        "policies in force {:.1} s after apply; checks done {:.1} s after apply",
        settle.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
