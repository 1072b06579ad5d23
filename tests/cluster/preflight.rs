//! `flexnode preflight` (src/cli/preflight.rs), the real binary against the real API server:
//! every check `join` makes, in order, with its fix; the cluster's side (the server reached
//! and verified, the credential accepted, the clocks agreeing) proven against the lab, the
//! host's side reported for this machine (no systemd here: those checks are named in
//! `--ignore-preflight-errors`, which a failure must be to pass).

use crate::support::Lab;
use crate::support::agent::apply_rbac;
use flexnode::cli::preflight::CHECKS;
use flexnode_test_tier::tier;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// What this build machine lacks that a node has.
const HOST_ONLY: &str = "Systemd,SystemdNspawn,Containerd,KernelModules,DiskSpace,KubeletPort";

fn preflight(config: &Path, ignore: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flexnode"))
        .args(["preflight", "-o", "json", "--config"])
        .arg(config)
        .arg(format!("--ignore-preflight-errors={ignore}"))
        .env("FLEXNODE_STATE", "/nonexistent/state.db")
        .output()
        .expect("run flexnode preflight");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn by_name(json: &str) -> Vec<(String, String, String, String)> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v.as_array()
        .expect("a list")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("name"), s("status"), s("message"), s("fix"))
        })
        .collect()
}

fn status<'a>(
    checks: &'a [(String, String, String, String)],
    name: &str,
) -> &'a (String, String, String, String) {
    checks
        .iter()
        .find(|c| c.0 == name)
        .unwrap_or_else(|| panic!("no {name}: {checks:?}"))
}

#[tier(controlplane)]
#[test]
fn preflight_checks_the_api_server_the_credential_and_the_clock() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = lab.node_kubeconfig("node-p");
    let config = dir.path().join("join.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: node-p\nkubeconfig: {}\nkubernetesVersion: v1.34.1\n",
            kubeconfig.display()
        ),
    )
    .expect("config");

    // A kubeconfig join: every check, in order; the cluster's side passes.
    let (code, out, err) = preflight(&config, HOST_ONLY);
    let checks = by_name(&out);
    let names: Vec<&str> = checks.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, CHECKS, "{err}");
    assert_eq!(code, 0, "{out}{err}");
    for c in &checks {
        assert!(["pass", "warn", "ignored"].contains(&c.1.as_str()), "{c:?}");
        assert!(c.1 == "pass" || !c.3.is_empty(), "no fix for {c:?}");
    }
    for name in ["ApiServer", "Credential", "ClockSkew"] {
        assert_eq!(status(&checks, name).1, "pass", "{checks:?}");
    }
    assert!(
        status(&checks, "Credential")
            .2
            .contains("system:flexnode:node-p"),
        "{checks:?}"
    );

    // Not ignored, every failure the first run ignored fails the run (exit 1).
    let were_ignored: Vec<String> = checks
        .iter()
        .filter(|c| c.1 == "ignored")
        .map(|c| c.0.clone())
        .collect();
    let (code, out, _) = preflight(&config, "");
    let again = by_name(&out);
    for name in &were_ignored {
        assert_eq!(status(&again, name).1, "fail", "{again:?}");
    }
    assert_eq!(code, i32::from(!were_ignored.is_empty()), "{out}");

    // A bootstrap token join against a CA that is not the cluster's: the server not verified.
    let other_ca = dir.path().join("other-ca.pem");
    let ca = rcgen::CertificateParams::new(Vec::<String>::new())
        .expect("params")
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert")
        .pem();
    std::fs::write(&other_ca, ca).expect("ca");
    let token = dir.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token_join = |ca: &Path| {
        let path = dir.path().join("token-join.yaml");
        std::fs::write(
            &path,
            format!(
                "nodeName: node-p\napiServer: {}\napiServerCAFile: {}\nbootstrapTokenFile: {}\n\
                 kubernetesVersion: v1.34.1\n",
                lab.state("APISERVER_URL"),
                ca.display(),
                token.display()
            ),
        )
        .expect("config");
        path
    };
    let (code, out, _) = preflight(&token_join(&other_ca), HOST_ONLY);
    let checks = by_name(&out);
    assert_eq!(code, 1, "{out}");
    let api = status(&checks, "ApiServer");
    assert_eq!(api.1, "fail", "{api:?}");
    assert!(api.3.contains("CA"), "{api:?}");
    for name in ["Credential", "ClockSkew"] {
        assert_eq!(status(&checks, name).1, "skipped", "{checks:?}");
    }
    assert!(!out.contains("0123456789abcdef"), "the token in {out}");

    // The cluster's CA, a token the API server does not know: the credential refused.
    let (code, out, _) = preflight(&token_join(&lab.dir.join("pki/ca.crt")), HOST_ONLY);
    let checks = by_name(&out);
    assert_eq!(code, 1, "{out}");
    assert_eq!(status(&checks, "ApiServer").1, "pass", "{checks:?}");
    let cred = status(&checks, "Credential");
    assert_eq!(cred.1, "fail", "{cred:?}");
    assert!(cred.3.contains("bootstrap token"), "{cred:?}");
    assert!(!out.contains("0123456789abcdef"), "the token in {out}");

    // An unknown name is refused, the checks named.
    let (code, _, err) = preflight(&config, "Sawp");
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("\"Sawp\" is no check") && err.contains("Swap"),
        "{err}"
    );
}
