//! The generated CRDs against a real kube-apiserver (built from pinned upstream modules by
//! `e2e/controlplane/run`): the AKS Flex Node manifests apply unchanged, printer columns and
//! the `spec.machineRef` field selector work. Skipped only with FLEXNODE_SKIP_CONTROLPLANE=1.

use crate::support;

use flexnode_test_tier::tier;
use std::path::Path;
use support::Lab;

#[tier(controlplane)]
#[test]
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

/// The `Machine`/`MachineOperation` manifests of upstream's own documentation (every YAML
/// block of the pinned module's `docs/` and `cmd/` that is one), as a user would copy them.
fn upstream_examples() -> Vec<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/upstream/fetch");
    let out = std::process::Command::new(&script)
        .output()
        .expect("run e2e/upstream/fetch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut files = Vec::new();
    let mut dirs = vec![root.join("docs"), root.join("cmd")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("read upstream dir")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read md");
        for block in text.split("```yaml\n").skip(1) {
            let block = block.split("```").next().unwrap_or_default();
            for doc in block.split("\n---\n") {
                let Ok(v) = serde_saphyr::from_str::<serde_json::Value>(doc) else {
                    continue;
                };
                let ours = v["apiVersion"].as_str() == Some("unbounded-cloud.io/v1alpha3")
                    && matches!(v["kind"].as_str(), Some("Machine" | "MachineOperation"));
                if ours {
                    found.push(v);
                }
            }
        }
    }
    found
}

#[tier(controlplane)]
#[test]
fn upstream_documentation_manifests_apply_unchanged() {
    let examples = upstream_examples();
    assert!(
        examples.len() >= 20,
        "only {} upstream examples found",
        examples.len()
    );
    let lab = Lab::up();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": examples});
    let file = lab.dir.join("upstream-examples.json");
    std::fs::write(&file, list.to_string()).expect("write");
    let (ok, out) = lab.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        &file.display().to_string(),
    ]);
    assert!(ok, "an upstream manifest was refused:\n{out}");
    assert_eq!(
        out.matches("(server dry run)").count(),
        examples.len(),
        "{out}"
    );
}
