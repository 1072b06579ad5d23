//! The `flexnode` binary: status and history read the store directly (daemon not needed).

use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::Build;
use flexnode::sim::{SimNode, upgrade};
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
    assert_eq!(json["apiVersion"], "flexnode.io/v1alpha1");
    assert_eq!(json["kind"], "NodeHistory");
    assert_eq!(json["entries"].as_array().map(Vec::len), Some(2));
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
fn join_exits_78_naming_an_impossible_setting_and_never_leaks_the_credential() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = dir.path().join("node.kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\nusers:\n- name: u\n  user:\n    token: TOPSECRET\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .expect("write");
    let private_kc = dir.path().join("private.kubeconfig");
    std::fs::copy(&kc, &private_kc).expect("copy");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&private_kc, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let private_kc = private_kc.display().to_string();
    let kc = kc.display().to_string();
    let state = dir.path().join("state.db").display().to_string();
    let image = format!(
        "installMode: container\nagentImage: oci://127.0.0.1:5000/flexnode\nagentImageDigest: {}\n",
        "ab".repeat(32)
    );
    let cases = [
        (
            format!("kubeconfig: {kc}\nkubernetesVersion: v1.34.12\ninstallMode: container\n"),
            "agentImage",
        ),
        // A valid container-install config outside a container of the agent's image: only
        // its bootstrap unit (`flexnode ignition`) runs that join.
        (
            format!("kubeconfig: {private_kc}\nkubernetesVersion: v1.34.12\n{image}"),
            "installMode",
        ),
        (
            format!("nodeName: Bad_Name\nkubeconfig: {kc}\nkubernetesVersion: v1.34.12\n"),
            "nodeName",
        ),
        (
            format!("kubeconfig: {kc}\nkubernetesVersion: latest\n"),
            "kubernetesVersion",
        ),
        (
            format!("kubeconfig: {kc}\nkubernetesVersion: v1.34.12\ninstallMode: vm\n"),
            "installMode",
        ),
        (
            format!("kubeconfig: {kc}\nkubernetesVersion: v1.34.12\nnodeNmae: a\n"),
            "nodeNmae",
        ),
        // The credential is group-readable (written with the default umask, 0644).
        (
            format!("nodeName: a\nkubeconfig: {kc}\nkubernetesVersion: v1.34.12\n"),
            "kubeconfig",
        ),
    ];
    for (i, (config, setting)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("join-{i}.yaml"));
        std::fs::write(&path, config).expect("write config");
        let out = flexnode(&[
            "--state",
            &state,
            "join",
            "--config",
            &path.display().to_string(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{setting}: {stderr}");
        assert!(
            stderr.contains(&format!("impossible setting: {setting}")),
            "{stderr}"
        );
        assert!(!stderr.contains("TOPSECRET"), "{stderr}");
    }
    // In a container (the host's root at FLEXNODE_HOST_ROOT): the host install is refused,
    // and so is a container install that does not say which image it runs.
    for (config, image, want) in [
        (
            format!("kubeconfig: {private_kc}\nkubernetesVersion: v1.34.12\n"),
            None,
            "\"host\" installs the agent on the host",
        ),
        (
            format!("kubeconfig: {private_kc}\nkubernetesVersion: v1.34.12\n{image}"),
            None,
            "does not say which image it runs",
        ),
        (
            format!("kubeconfig: {private_kc}\nkubernetesVersion: v1.34.12\n{image}"),
            Some("registry.example/flexnode:no-digest"),
            "does not say which image it runs",
        ),
    ] {
        let path = dir.path().join("join-in-container.yaml");
        std::fs::write(&path, config).expect("write config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flexnode"));
        cmd.args(["--state", &state, "join", "--config"])
            .arg(&path)
            .env("FLEXNODE_HOST_ROOT", dir.path())
            .env_remove("FLEXNODE_AGENT_IMAGE");
        if let Some(image) = image {
            cmd.env("FLEXNODE_AGENT_IMAGE", image);
        }
        let out = cmd.output().expect("run flexnode");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{stderr}");
        assert!(
            stderr.contains("impossible setting: installMode") && stderr.contains(want),
            "{stderr}"
        );
    }
    // Nothing was created for a refused join.
    assert!(!dir.path().join("state.db").exists());
}

#[test]
fn reset_without_yes_explains_and_changes_nothing() {
    let out = flexnode(&["reset"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"));
    let out = flexnode(&["version"]);
    assert!(out.status.success());
    assert!(text(&out).starts_with("flexnode "));
}

/// A root with only a static busybox and a marker: what `host-exec` runs sees that root as `/`.
fn busybox_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tmp");
    std::fs::create_dir(root.path().join("bin")).expect("bin");
    // e2e/prereqs installs busybox-static.
    std::fs::copy("/bin/busybox", root.path().join("bin/busybox")).expect("copy busybox");
    std::fs::write(root.path().join("marker"), "inside the root\n").expect("marker");
    root
}

fn host_exec(root: &std::path::Path, command: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flexnode"))
        .arg("host-exec")
        .arg("--root")
        .arg(root)
        .arg("--")
        .args(command)
        .env("FLEXNODE_TEST_SECRET", "TOPSECRET")
        .output()
        .expect("run flexnode host-exec")
}

#[test]
fn host_exec_runs_a_program_chrooted_with_only_path() {
    let root = busybox_root();
    let cat = host_exec(root.path(), &["/bin/busybox", "cat", "/marker"]);
    assert!(cat.status.success(), "{cat:?}");
    assert_eq!(text(&cat), "inside the root\n");
    let ls = host_exec(root.path(), &["/bin/busybox", "ls", "/"]);
    assert_eq!(text(&ls), "bin\nmarker\n", "{ls:?}");
    let env = host_exec(root.path(), &["/bin/busybox", "env"]);
    assert_eq!(
        text(&env),
        format!("PATH={}\n", flexnode::effects::host::CHECK_PATH)
    );
    let pwd = host_exec(root.path(), &["/bin/busybox", "pwd"]);
    assert_eq!(text(&pwd), "/\n");
}

#[test]
fn host_exec_refuses_what_it_cannot_run() {
    let root = busybox_root();
    let relative = host_exec(root.path(), &["bin/busybox", "true"]);
    assert_eq!(relative.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&relative.stderr).contains("not an absolute path"));
    let missing = host_exec(root.path(), &["/usr/sbin/modprobe", "overlay"]);
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    let no_root = host_exec(&root.path().join("absent"), &["/bin/busybox", "true"]);
    assert_eq!(no_root.status.code(), Some(126));
    assert!(String::from_utf8_lossy(&no_root.stderr).contains("chroot"));
}

#[tokio::test]
async fn run_in_root_reports_a_failure_with_its_stderr() {
    use flexnode::effects::host::run_in_root;
    use std::time::Duration;
    let root = busybox_root();
    let agent = std::path::Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let long = Duration::from_secs(30);
    run_in_root(
        agent,
        root.path(),
        "/bin/busybox",
        &["test", "-f", "/marker"],
        long,
    )
    .await
    .expect("the marker is a file inside the root");
    let err = run_in_root(agent, root.path(), "/bin/busybox", &["ls", "/etc"], long)
        .await
        .expect_err("no /etc inside the root");
    let message = err.to_string();
    assert!(
        message.contains("host /bin/busybox failed") && message.contains("/etc"),
        "{message}"
    );
    let err = run_in_root(
        agent,
        root.path(),
        "/bin/busybox",
        &["sleep", "5"],
        Duration::from_millis(300),
    )
    .await
    .expect_err("timed out");
    assert!(err.to_string().contains("did not finish within"), "{err}");
}

/// The printed bash script is the checked-in one, and bash completes with it: `flexnode op c`
/// offers `create`, `flexnode status --output ` offers the formats.
#[test]
fn completions_complete_in_bash() {
    let out = flexnode(&["completions", "bash"]);
    assert!(out.status.success());
    let checked_in = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/completions/flexnode.bash"
    ))
    .expect("completions/flexnode.bash");
    assert!(
        out.stdout == checked_in,
        "completions/flexnode.bash is stale"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let script = dir.path().join("flexnode.bash");
    std::fs::write(&script, &out.stdout).expect("write the script");
    let complete = |words: &str| {
        let probe = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _flexnode flexnode \"${{COMP_WORDS[-1]}}\" \"${{COMP_WORDS[-2]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash")
            .args(["-c", &probe])
            .output()
            .expect("run bash");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text(&out)
    };
    assert!(complete("flexnode op c").lines().any(|l| l == "create"));
    let formats = complete("flexnode status --output ''");
    assert!(formats.lines().any(|l| l == "json"), "{formats}");
    let out = flexnode(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "an unknown shell is a usage error"
    );
}
