//! Exec credentials (src/identity/exec.rs, `flexnode token`) against the real API server's JWT
//! authenticator and the lab's identity provider (`e2e/controlplane/run up --issuer`): a
//! client secret and a metadata endpoint each become the agent's identity — the same RBAC
//! and admission policy as a certificate's — for kubectl (client-go, as the kubelet runs its
//! plugin) and for the agent's own client; the audience `kubelet` becomes the node's; a wrong
//! or exposed secret is refused without being echoed.

use crate::apiserver_rbac::{
    Agent, IN_PROGRESS, OPS_POLICY, apply, apply_yaml, op, until_refused_by,
};
use crate::support::Lab;
use flexnode::config::kubeconfig::client_from_kubeconfig;
use flexnode_test_tier::tier;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const FLEXNODE: &str = env!("CARGO_BIN_EXE_flexnode");

/// A client of the issuer whose tokens name `node`: its secret file, or none for a metadata
/// identity.
fn issuer_client(lab: &Lab, id: &str, node: &str, metadata: bool) -> Option<PathBuf> {
    let mut cmd = Command::new(crate::support::script());
    cmd.args(["issuer-client", id, node, "--dir"]).arg(&lab.dir);
    if metadata {
        cmd.arg("--metadata");
    }
    let out = cmd.output().expect("issuer-client");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// A kubeconfig (0600) whose user runs `flexnode token ARGS`.
fn exec_kubeconfig(lab: &Lab, name: &str, args: &[&str]) -> PathBuf {
    let ca = lab.dir.join("pki/ca.crt");
    let mut all = vec![
        "token".to_string(),
        "--ca-file".into(),
        ca.display().to_string(),
    ];
    all.extend(args.iter().map(|a| a.to_string()));
    let text = serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {
            "server": lab.state("APISERVER_URL"), "certificate-authority": ca}}],
        "users": [{"name": "agent", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1", "command": FLEXNODE,
            "args": all, "interactiveMode": "Never"}}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "agent"}}],
    })
    .to_string();
    let path = lab.dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}

/// `kubectl auth whoami` through `kubeconfig`: (user name, groups, uid).
fn whoami(lab: &Lab, kubeconfig: &Path) -> (String, Vec<String>, String) {
    let (ok, out) = Agent::with(lab, kubeconfig.to_path_buf()).kubectl(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo}",
    ]);
    assert!(ok, "whoami: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("userInfo");
    let groups = v["groups"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    (
        v["username"].as_str().unwrap_or_default().into(),
        groups,
        v["uid"].as_str().unwrap_or_default().into(),
    )
}

/// `flexnode token ARGS`: (success, stderr).
fn token(args: &[&str]) -> (bool, String) {
    let out = Command::new(FLEXNODE)
        .arg("token")
        .args(args)
        .output()
        .expect("flexnode token");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn exec_credentials_become_the_agents_and_the_kubelets_identity() {
    let lab = Lab::up_with_issuer();
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/rbac");
    apply(&lab, &rbac.join("agent-rbac.yaml"));
    apply(&lab, &rbac.join("agent-admission-policy.yaml"));
    apply_yaml(
        &lab,
        "ops.yaml",
        &(op("reboot-node-e", "machineRef: node-e") + &op("reboot-node-f", "machineRef: node-f")),
    );
    let issuer = lab.state("ISSUER_URL");
    let token_url = format!("{issuer}/token");
    let secret = issuer_client(&lab, "node-e", "node-e", false).expect("a secret");
    let secret = secret.display().to_string();
    issuer_client(&lab, "node-m", "node-m", true);
    let by_secret = [
        "--token-url",
        &token_url,
        "--client-id",
        "node-e",
        "--client-secret-file",
        &secret,
    ];

    // A service principal's shape: the agent's identity, bound like a certificate's.
    let agent = exec_kubeconfig(&lab, "exec-agent", &by_secret);
    let (user, groups, uid) = whoami(&lab, &agent);
    assert_eq!(user, "system:flexnode:node-e");
    assert!(
        groups.contains(&"flexnode:agents".to_string()),
        "{groups:?}"
    );
    assert_eq!(uid, "node-e", "the token's subject");
    let node_e = Agent::with(&lab, agent.clone());
    let (ok, out) = node_e.patch_status("mop", "reboot-node-e", IN_PROGRESS);
    assert!(ok && out.trim() == "InProgress", "{out}");
    let out = until_refused_by(OPS_POLICY, || {
        node_e.patch_status("mop", "reboot-node-f", IN_PROGRESS)
    });
    assert!(
        out.contains("system:flexnode:node-e (node node-e) may not write"),
        "{out}"
    );

    // The agent's own client (kube-rs) runs the same plugin.
    let client = client_from_kubeconfig(&agent).await.expect("client");
    let review = Api::<SelfSubjectReview>::all(client)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let info = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(info.username.as_deref(), Some("system:flexnode:node-e"));

    // A managed identity's shape: no secret, the metadata endpoint (plain http on loopback).
    let metadata = format!("{}?client_id=node-m", lab.state("ISSUER_METADATA_URL"));
    let managed = exec_kubeconfig(&lab, "exec-managed", &["--metadata-url", &metadata]);
    assert_eq!(whoami(&lab, &managed).0, "system:flexnode:node-m");

    // The audience kubelet: the node's identity, for the kubelet's plugin.
    let mut kubelet_args = by_secret.to_vec();
    kubelet_args.extend(["--audience", "kubelet"]);
    let kubelet = exec_kubeconfig(&lab, "exec-kubelet", &kubelet_args);
    let (user, groups, _) = whoami(&lab, &kubelet);
    assert_eq!(user, "system:node:node-e");
    assert!(groups.contains(&"system:nodes".to_string()), "{groups:?}");

    // A wrong secret: refused by the provider, the secret not echoed.
    let wrong = lab.dir.join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret-0123456789\n").expect("write");
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let wrong_s = wrong.display().to_string();
    let (ok, err) = token(&[
        "--ca-file",
        &lab.dir.join("pki/ca.crt").display().to_string(),
        "--token-url",
        &token_url,
        "--client-id",
        "node-e",
        "--client-secret-file",
        &wrong_s,
    ]);
    assert!(!ok && err.contains("HTTP 401: invalid_client"), "{err}");
    assert!(!err.contains("not-the-secret"), "{err}");
    // A secret others may read is not used.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (ok, err) = token(&[
        "--token-url",
        &token_url,
        "--client-id",
        "node-e",
        "--client-secret-file",
        &wrong_s,
    ]);
    assert!(!ok && err.contains("chmod 600"), "{err}");
    // A secret never goes over plain http to a remote host.
    let (ok, err) = token(&[
        "--token-url",
        "http://login.example/token",
        "--client-id",
        "x",
        "--client-secret-file",
        &secret,
    ]);
    assert!(!ok && err.contains("must be https"), "{err}");
}
