//! The `flexnode` binary: status and history read the store directly (daemon not needed).

use flexnode::effects::sim::Build;
use flexnode::machine::Timestamp;
use flexnode::machine::state::InstallMode;
use flexnode::simlab::{SimNode, upgrade};
use std::process::{Command, Output};

fn flexnode(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flexnode"))
        .args(args)
        .output()
        .expect("run flexnode")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn upgraded_store(dir: &tempfile::TempDir) -> String {
    let p = dir.path().join("state/state.db");
    let mut node = SimNode::new(&p, Timestamp::from_millis(1_785_578_400_000));
    let url = "https://a.example/f.tgz?sig=TOPSECRET";
    let sha = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    node.host.serve_artifact(
        url,
        sha,
        Build {
            version: "0.2.0".into(),
            crashes: false,
        },
    );
    node.join(InstallMode::Host, "edge-07").await.expect("join");
    node.boot().await.expect("boot");
    node.claim("u1", upgrade(url, sha)).await.expect("claim");
    node.stop_process(); // the daemon is stopped mid hand-off
    p.display().to_string()
}

#[tokio::test]
async fn status_reads_the_store_with_the_daemon_stopped() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = upgraded_store(&dir).await;
    let out = flexnode(&["--state", &store, "status"]);
    assert!(out.status.success(), "{out:?}");
    let t = text(&out);
    assert!(
        t.contains("Phase:            Upgrading (HandingOff)"),
        "{t}"
    );
    assert!(t.contains("edge-07 (host install)"), "{t}");
    assert!(t.contains("Operation:        op-u1"), "{t}");
    assert_eq!(t.matches("\n  #").count(), 5, "last 5 transitions: {t}");
    assert!(!t.contains("TOPSECRET"));

    let json: serde_json::Value =
        serde_json::from_slice(&flexnode(&["--state", &store, "status", "-o", "json"]).stdout)
            .expect("json");
    assert_eq!(json["apiVersion"], "flexnode.io/v1alpha1");
    assert_eq!(json["kind"], "NodeStatus");
    assert_eq!(json["phase"], "Upgrading");
    assert_eq!(json["node"]["activeSide"], "kube1");
    assert_eq!(json["currentOperation"]["uid"], "u1");
    assert_eq!(json["recentTransitions"].as_array().map(Vec::len), Some(5));

    let yaml = text(&flexnode(&[
        "--state", &store, "status", "--output", "yaml",
    ]));
    assert!(yaml.contains("apiVersion: flexnode.io/v1alpha1"), "{yaml}");
}

#[tokio::test]
async fn history_prints_the_whole_journal_without_secrets() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = upgraded_store(&dir).await;
    let out = flexnode(&["--state", &store, "history"]);
    assert!(out.status.success());
    let t = text(&out);
    assert!(t.lines().count() >= 6, "{t}");
    assert!(t.contains("OperationClaimed(AgentUpgrade op-u1)"));
    assert!(t.contains("?<redacted>"));
    assert!(!t.contains("TOPSECRET"));
    let json: serde_json::Value = serde_json::from_slice(
        &flexnode(&["--state", &store, "history", "-o", "json", "--limit", "2"]).stdout,
    )
    .expect("json");
    assert_eq!(json.as_array().map(Vec::len), Some(2));
}

#[test]
fn a_missing_store_exits_2_with_a_message() {
    let dir = tempfile::tempdir().expect("tmp");
    let missing = dir.path().join("nope/state.db");
    for cmd in ["status", "history"] {
        let out = flexnode(&["--state", &missing.display().to_string(), cmd]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no flexnode store"));
    }
}

#[test]
fn later_subcommands_say_not_implemented_and_fail() {
    for args in [&["join"][..], &["reset"]] {
        let out = flexnode(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not implemented yet"));
    }
    let out = flexnode(&["version"]);
    assert!(out.status.success());
    assert!(text(&out).starts_with("flexnode "));
}
