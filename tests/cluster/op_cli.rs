//! `flexnode op` (the built binary) against a real kube-apiserver, with a daemon on a simulated
//! host where an operation has to finish.

use crate::support;

use flexnode::config::kubeconfig::client_from_kubeconfig;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::Build;
use flexnode_test_tier::tier;
use kube::api::Api;
use std::path::{Path, PathBuf};
use std::time::Instant;
use support::Lab;
use support::agent::{Agent, apply_rbac, create_node_and_machine};
use support::cli::Run;

/// What the simulated host serves at `SERVED_URL`.
const SERVED_SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SERVED_URL: &str = "https://x.example/f.tgz";
/// A digest nothing is served under.
const OTHER_SHA: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

/// Runs `flexnode op ARGS --kubeconfig KUBECONFIG`.
async fn op(kubeconfig: &Path, args: &[&str]) -> Run {
    support::cli::run("op", kubeconfig, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn op_creates_lists_gets_and_waits() {
    let lab = Lab::up();
    let started = Instant::now();
    let kc: PathBuf = lab.kubeconfig();
    let kc = kc.as_path();
    let client = client_from_kubeconfig(kc).await.expect("admin client");

    // Invalid upgrade parameters: the validator's fixed message, exit 78, no secret echoed,
    // nothing created.
    let bad = op(
        kc,
        &[
            "create",
            "upgrade",
            "--node",
            "edge-07",
            "--url",
            "https://user:s3cr3tpw@x.example/f.tgz?sig=TOKEN123SAS",
            "--sha256",
            SERVED_SHA,
        ],
    )
    .await;
    assert_eq!(bad.code, Some(78), "{bad:?}");
    assert!(
        bad.stderr
            .contains("parameter downloadURL must not contain credentials"),
        "{bad:?}"
    );
    assert!(
        !bad.all().contains("s3cr3tpw") && !bad.all().contains("TOKEN123SAS"),
        "{bad:?}"
    );
    let bad = op(
        kc,
        &[
            "create",
            "upgrade",
            "--node",
            "edge-07",
            "--image",
            "oci://registry.example/flexnode:v2?sig=TOKEN123SAS",
            "--digest",
            &format!("sha256:{SERVED_SHA}"),
        ],
    )
    .await;
    assert_eq!(bad.code, Some(78), "{bad:?}");
    assert!(!bad.all().contains("TOKEN123SAS"), "{bad:?}");
    // Usage errors.
    for args in [
        &["create", "reboot"][..],
        &["create", "reboot", "--node", "a", "--selector", "k=v"],
        &["create", "upgrade", "--node", "a"],
        &["create", "reboot", "--node", "a", "--sha256", SERVED_SHA],
        &["create", "reboot", "--node", "a", "--ttl", "soon"],
    ] {
        let r = op(kc, args).await;
        assert_eq!(r.code, Some(78), "{args:?}: {r:?}");
    }
    let empty = op(kc, &["list"]).await;
    assert_eq!(empty.code, Some(0), "{empty:?}");
    assert_eq!(empty.stdout, "", "nothing was created: {empty:?}");

    // Created for a node without an agent: stays Pending, and get/list show it.
    let r = op(
        kc,
        &[
            "create", "reboot", "--node", "ghost-01", "--name", "r-ghost", "--ttl", "1h",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(r.stdout, "machineoperation/r-ghost created\n");
    let r = op(kc, &["create", "reboot", "--node", "ghost-01"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout
            .starts_with("machineoperation/nodereboot-ghost-01-"),
        "{r:?}"
    );
    let r = op(kc, &["create", "reset", "--selector", "site=a,tier=edge"]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.starts_with("machineoperation/agentreset-sel-"),
        "{r:?}"
    );

    let get = op(kc, &["get", "r-ghost"]).await;
    assert_eq!(get.code, Some(0), "{get:?}");
    for want in [
        "Name:       r-ghost",
        "Machine:    ghost-01",
        "Operation:  NodeReboot",
        "Phase:      Pending",
    ] {
        assert!(get.stdout.contains(want), "{want}: {get:?}");
    }
    let json = op(kc, &["get", "r-ghost", "-o", "json"]).await;
    assert_eq!(json.code, Some(0), "{json:?}");
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("json");
    assert_eq!(v["kind"], "MachineOperation");
    assert_eq!(v["spec"]["machineRef"], "ghost-01");
    assert_eq!(v["spec"]["ttlSecondsAfterFinished"], 3600);

    // A SAS token in a valid URL is stored (the agent needs it) but never printed.
    let r = op(
        kc,
        &[
            "create",
            "upgrade",
            "--node",
            "ghost-01",
            "--name",
            "up-ghost",
            "--url",
            "https://x.example/f.tgz?sig=TOKEN123SAS",
            "--sha256",
            &SERVED_SHA.to_uppercase(),
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    let stored = Api::<flexnode::api::MachineOperation>::all(client.clone())
        .get("up-ghost")
        .await
        .expect("get");
    let params = stored.spec.parameters.expect("parameters");
    assert_eq!(
        params["downloadURL"],
        "https://x.example/f.tgz?sig=TOKEN123SAS"
    );
    assert_eq!(params["sha256"], SERVED_SHA, "stored lowercase");
    for format in ["json", "yaml", "human"] {
        let r = op(kc, &["get", "up-ghost", "-o", format]).await;
        assert_eq!(r.code, Some(0), "{r:?}");
        assert!(!r.all().contains("TOKEN123SAS"), "{format}: {r:?}");
        if format != "human" {
            assert!(
                r.stdout.contains("https://x.example/f.tgz?<redacted>"),
                "{format}: {r:?}"
            );
        }
    }

    let list = op(kc, &["list", "--node", "ghost-01"]).await;
    assert_eq!(list.code, Some(0), "{list:?}");
    let lines: Vec<&str> = list.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "MACHINE", "OPERATION", "PHASE", "AGE"]);
    assert_eq!(lines.len(), 4, "three operations for ghost-01: {list:?}");
    let row: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("r-ghost "))
        .expect("r-ghost listed")
        .split_whitespace()
        .collect();
    assert_eq!(&row[..4], ["r-ghost", "ghost-01", "NodeReboot", "Pending"]);
    assert!(
        !list.stdout.contains("agentreset-sel-"),
        "the selector operation is not addressed to ghost-01: {list:?}"
    );
    let all = op(kc, &["list"]).await;
    assert!(all.stdout.contains("selector:site=a,tier=edge"), "{all:?}");
    for format in ["json", "yaml"] {
        let r = op(kc, &["list", "--node", "ghost-01", "-o", format]).await;
        assert_eq!(r.code, Some(0), "{r:?}");
        assert!(!r.all().contains("TOKEN123SAS"), "{format}: {r:?}");
        let v: serde_json::Value = if format == "json" {
            serde_json::from_str(&r.stdout).expect("JSON")
        } else {
            serde_saphyr::from_str(&r.stdout).expect("YAML")
        };
        assert_eq!(v["kind"], "List", "{format}: {v}");
        let names: Vec<&str> = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names.len(), 3, "{format}: {names:?}");
        assert!(names.contains(&"r-ghost"), "{format}: {names:?}");
    }

    // As a kubectl plugin: `kubectl flexnode …` runs it (found on PATH as kubectl-flexnode)
    // and its usage names the command as typed.
    let plugins = tempfile::tempdir().expect("tmp");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_flexnode"),
        plugins.path().join("kubectl-flexnode"),
    )
    .expect("install the plugin");
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(lab.bin().join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", kc)
            .output()
            .expect("run kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let (code, text) = kubectl(&["plugin", "list"]);
    assert!(
        code == Some(0) && text.contains("kubectl-flexnode"),
        "{text}"
    );
    let (code, text) = kubectl(&["flexnode", "op", "list", "--node", "ghost-01"]);
    assert!(code == Some(0) && text.contains("r-ghost"), "{text}");
    let (code, text) = kubectl(&["flexnode", "op", "list", "--bogus"]);
    assert_eq!(code, Some(64), "{text}");
    assert!(text.contains("Usage: kubectl flexnode op list"), "{text}");

    // Missing object; unreachable kubeconfig.
    let r = op(kc, &["get", "nope"]).await;
    assert_eq!(r.code, Some(1), "{r:?}");
    assert_eq!(r.stderr.lines().count(), 1, "{r:?}");
    assert!(r.stderr.contains("not found"), "{r:?}");
    let r = op(&lab.dir.join("missing.kubeconfig"), &["list"]).await;
    assert_eq!(r.code, Some(78), "{r:?}");

    // --wait gives up: exit 3.
    let r = op(
        kc,
        &[
            "create",
            "reboot",
            "--node",
            "ghost-01",
            "--name",
            "r-timeout",
            "--wait",
            "--timeout",
            "2s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(3), "{r:?}");
    assert_eq!(
        r.stdout, "machineoperation/r-timeout created\nPending\n",
        "{r:?}"
    );

    // With a daemon for edge-07: reboot completes, an unservable upgrade fails.
    apply_rbac(&lab);
    create_node_and_machine(&client, "edge-07", &[]).await;
    let mut agent = Agent::join(&lab, "edge-07", InstallMode::Host).await;
    agent.host.serve_artifact(
        SERVED_URL,
        SERVED_SHA,
        Build {
            version: "0.2.0".into(),
            crashes: false,
        },
    );
    let r = op(
        kc,
        &[
            "create",
            "reboot",
            "--node",
            "edge-07",
            "--name",
            "r-edge",
            "--wait",
            "--timeout",
            "60s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        r.stdout.starts_with("machineoperation/r-edge created\n"),
        "{r:?}"
    );
    assert!(
        r.stdout.ends_with("Complete: NodeReboot completed\n"),
        "{r:?}"
    );

    let r = op(
        kc,
        &[
            "create",
            "upgrade",
            "--node",
            "edge-07",
            "--name",
            "up-edge",
            "--url",
            SERVED_URL,
            "--sha256",
            OTHER_SHA,
            "--wait",
            "--timeout",
            "60s",
        ],
    )
    .await;
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.stdout.contains("\nFailed (ExecutionFailed): "), "{r:?}");
    let list = op(kc, &["list", "--node", "edge-07"]).await;
    let phases: Vec<Vec<&str>> = list
        .stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    assert_eq!(
        phases,
        [
            ["r-edge", "edge-07", "NodeReboot", "Complete"],
            ["up-edge", "edge-07", "AgentUpgrade", "Failed"],
        ],
        "{list:?}"
    );
    let get = op(kc, &["get", "up-edge"]).await;
    assert!(
        get.stdout.contains("Reason:     ExecutionFailed"),
        "{get:?}"
    );
    agent.kill().await;
    eprintln!("op_cli: {:.1?} after the lab came up", started.elapsed());
}
