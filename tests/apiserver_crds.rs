//! The generated CRDs against a real kube-apiserver (built from pinned upstream modules by
//! `e2e/controlplane/run`): the AKS Flex Node manifests apply unchanged, printer columns and
//! the `spec.machineRef` field selector work. Skipped only with FLEXNODE_SKIP_CONTROLPLANE=1.

use std::path::{Path, PathBuf};
use std::process::Command;

struct Lab {
    dir: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/controlplane/run")
}

impl Lab {
    fn up() -> Self {
        let dir = std::env::temp_dir().join(format!("flexnode-crd-test-{}", std::process::id()));
        let out = Command::new(script())
            .args(["up", "--no-kcm", "--dir"])
            .arg(&dir)
            .output()
            .expect("run e2e/controlplane/run up");
        assert!(
            out.status.success(),
            "control plane did not come up:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir }
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(script())
            .args(["kubectl", "--dir"])
            .arg(&self.dir)
            .arg("--")
            .args(args)
            .output()
            .expect("kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["down", "--dir"])
            .arg(&self.dir)
            .status();
    }
}

#[test]
fn crds_accept_the_upstream_examples_and_select_by_machine_ref() {
    if std::env::var_os("FLEXNODE_SKIP_CONTROLPLANE").is_some() {
        eprintln!("skipped: FLEXNODE_SKIP_CONTROLPLANE is set");
        return;
    }
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
