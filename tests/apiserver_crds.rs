//! The generated CRDs against a real kube-apiserver (built from pinned upstream modules by
//! `e2e/controlplane/run`): the AKS Flex Node manifests apply unchanged, printer columns and
//! the `spec.machineRef` field selector work. Skipped only with FLEXNODE_SKIP_CONTROLPLANE=1.

mod support;

use std::path::Path;
use support::Lab;

#[test]
#[cfg_attr(
    flexnode_skip = "controlplane",
    ignore = "SKIPPED controlplane: FLEXNODE_SKIP_CONTROLPLANE=1"
)]
fn crds_accept_the_upstream_examples_and_select_by_machine_ref() {
    let lab = Lab::up();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/samples");
    let (ok, out) = lab.kubectl(&["apply", "-f", &samples.display().to_string()]);
    assert!(ok, "{out}");
    assert_eq!(out.matches("created").count(), 5, "{out}");
    let (ok, out) = lab.kubectl(&[
        "get",
        "mop",
        "--field-selector",
        "spec.machineRef=edge-07",
        "-o",
        "custom-columns=NAME:.metadata.name",
        "--no-headers",
    ]);
    assert!(ok, "{out}");
    let mut names: Vec<&str> = out.lines().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "reboot-edge-07-20260801",
            "upgrade-edge-07-image",
            "upgrade-edge-07-v0-2-1"
        ]
    );
    let (ok, out) = lab.kubectl(&[
        "get",
        "mop",
        "--field-selector",
        "spec.operationKind=AgentReset",
        "--no-headers",
    ]);
    assert!(ok && out.starts_with("reset-by-label"), "{out}");
    let (ok, out) = lab.kubectl(&["get", "mop", "reboot-edge-07-20260801"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("MACHINE") && out.contains("OPERATION") && out.contains("NodeReboot"),
        "{out}"
    );
    // Status is a subresource: a spec update cannot set it.
    let (ok, out) = lab.kubectl(&[
        "patch",
        "mop",
        "reboot-edge-07-20260801",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Complete"}}"#,
        "-o",
        "jsonpath={.status.phase}",
    ]);
    assert!(
        ok && out.trim().is_empty(),
        "status written through the main resource: {out}"
    );
    // The enum is enforced by the API server.
    let bad = r#"{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"MachineOperation","metadata":{"name":"bad"},"spec":{"machineRef":"x","operationKind":"Explode"}}"#;
    let tmp = lab.dir.join("bad.json");
    std::fs::write(&tmp, bad).expect("write");
    let (ok, out) = lab.kubectl(&["apply", "-f", &tmp.display().to_string()]);
    assert!(!ok && out.contains("Unsupported value"), "{out}");
}
