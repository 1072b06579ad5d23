//! `flexnode ignition` against the upstream validator: the rendered Ignition passes
//! `ignition-validate` (built from `github.com/coreos/ignition/v2`, pinned in
//! `e2e/ignition/go.mod`, by `e2e/ignition/build`) with no warning; the Butane says the same
//! as the Ignition; every file is 0600 and outside `/usr`, `/opt` and `/usr/local`; the inputs
//! arrive unchanged; no secret is in a unit or the install settings.

use base64::Engine;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const HEX: &str = "3c4d5e6f3c4d5e6f3c4d5e6f3c4d5e6f3c4d5e6f3c4d5e6f3c4d5e6f3c4d5e6f";
const TOKEN: &str = "SECRET-CLIENT-KEY-DATA";
const PASSWORD: &str = "SECRET-REGISTRY-PASSWORD";

fn validator() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/ignition/build");
    let out = Command::new(&script)
        .output()
        .expect("run e2e/ignition/build");
    assert!(
        out.status.success(),
        "e2e/ignition/build failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn private(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path.to_path_buf()
}

fn inputs(dir: &Path) -> (PathBuf, String, String, String) {
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.2.100:6443\n\
         users:\n- name: u\n  user:\n    token: {TOKEN}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    \
         user: u\ncurrent-context: x\n"
    );
    let ca = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")
        .expect("a PEM bundle to stand for the CA");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("puller:{PASSWORD}"));
    let creds = format!(r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}"}}}}}}"#);
    let kc = private(&dir.join("node.kubeconfig"), &kubeconfig);
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca).expect("ca");
    let cr = private(&dir.join("registry.json"), &creds);
    let config = format!(
        "nodeName: edge-1\nkubeconfig: {}\nkubernetesVersion: v1.34.12\ninstallMode: container\n\
         agentImage: oci://127.0.0.1:5000/flexnode:0.1.0\nagentImageDigest: sha256:{HEX}\n\
         trustedCAFile: {}\nregistryCredentialsFile: {}\n",
        kc.display(),
        ca_file.display(),
        cr.display()
    );
    (
        private(&dir.join("join.yaml"), &config),
        kubeconfig,
        ca,
        creds,
    )
}

fn flexnode(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flexnode"))
        .args(args)
        .env("FLEXNODE_STATE", "/nonexistent/state.db")
        .output()
        .expect("run flexnode")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
}

fn decode(source: &str) -> String {
    let b64 = source
        .strip_prefix("data:;base64,")
        .unwrap_or_else(|| panic!("not a base64 data URL: {source}"));
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64"),
    )
    .expect("utf-8")
}

/// (path, mode, contents) of each file of an Ignition or Butane document.
fn files_of(doc: &Value, contents: impl Fn(&Value) -> String) -> Vec<(String, u64, String)> {
    doc["storage"]["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            (
                f["path"].as_str().expect("path").to_string(),
                f["mode"].as_u64().expect("mode"),
                contents(&f["contents"]),
            )
        })
        .collect()
}

fn validate(validator: &Path, file: &Path) -> (bool, String) {
    let out = Command::new(validator)
        .arg(file)
        .output()
        .expect("ignition-validate");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_rendered_first_boot_is_valid_ignition_and_carries_the_inputs() {
    let validator = validator();
    let dir = tempfile::tempdir().expect("tmp");
    let (config, kubeconfig, ca, creds) = inputs(dir.path());
    let out = dir.path().join("out");
    let r = flexnode(&[
        "ignition",
        "--config",
        config.to_str().expect("path"),
        "--out",
        out.to_str().expect("path"),
    ]);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(!stdout.contains("SECRET"), "{stdout}");
    let (ign_path, bu_path) = (out.join("config.ign"), out.join("config.bu"));
    assert_eq!(mode(&out), 0o700);
    assert_eq!((mode(&ign_path), mode(&bu_path)), (0o600, 0o600));

    let (ok, findings) = validate(&validator, &ign_path);
    assert!(
        ok && findings.trim().is_empty(),
        "ignition-validate: {findings}"
    );

    let ign: Value =
        serde_json::from_str(&std::fs::read_to_string(&ign_path).expect("read")).expect("json");
    assert_eq!(ign["ignition"]["version"], "3.4.0");
    let files = files_of(&ign, |c| decode(c["source"].as_str().expect("source")));
    let file = |p: &str| -> &str {
        &files
            .iter()
            .find(|(path, _, _)| path == p)
            .unwrap_or_else(|| panic!("no {p} in {files:?}"))
            .2
    };
    let hosts_dir = "/etc/containerd/certs.d/127.0.0.1:5000";
    for (path, mode, contents) in &files {
        // Private, but for the units' documentation, which every unit's `Documentation=` names.
        if path == flexnode::units::DOC_PATH {
            assert_eq!((*mode, contents.as_str()), (0o644, flexnode::units::DOC));
        } else {
            assert_eq!(*mode, 0o600, "{path}");
        }
        for banned in ["/usr/", "/opt/"] {
            assert!(!path.starts_with(banned), "{path} is under {banned}");
        }
        assert!(
            path.starts_with("/etc/flexnode/") || path.starts_with(hosts_dir),
            "{path}"
        );
    }
    // The bootstrap unit's first pull (ctr) gets the CA and the credentials from containerd's
    // own hosts directory: https, the CA, a Basic header from the credentials file's entry.
    assert_eq!(file(&format!("{hosts_dir}/ca.crt")), ca);
    let hosts = file(&format!("{hosts_dir}/hosts.toml"));
    for line in [
        "server = \"https://127.0.0.1:5000\"".to_string(),
        "[host.\"https://127.0.0.1:5000\"]".to_string(),
        format!("ca = \"{hosts_dir}/ca.crt\""),
        format!(
            "Authorization = \"Basic {}\"",
            base64::engine::general_purpose::STANDARD.encode(format!("puller:{PASSWORD}"))
        ),
    ] {
        assert!(hosts.lines().any(|l| l == line), "{line} in {hosts}");
    }
    assert_eq!(file("/etc/flexnode/bootstrap/kubeconfig"), kubeconfig);
    assert_eq!(file("/etc/flexnode/bootstrap/trusted-ca.pem"), ca);
    assert_eq!(
        file("/etc/flexnode/bootstrap/registry-credentials.json"),
        creds
    );
    let pinned = format!("127.0.0.1:5000/flexnode@sha256:{HEX}");
    let env = file("/etc/flexnode/install.env");
    for line in [
        format!("FLEXNODE_INSTALL_IMAGE={pinned}"),
        "FLEXNODE_INSTALL_REPOSITORY=127.0.0.1:5000/flexnode".to_string(),
    ] {
        assert!(env.lines().any(|l| l == line), "{line} in {env}");
    }
    assert!(!env.contains("FLEXNODE_INSTALL_ARCHIVE"), "{env}");
    // The join config points at the bootstrap copies and names the image by digest; it is a
    // config `join` accepts (its files are not there on this machine, so it stops at them).
    let bootstrap = file("/etc/flexnode/bootstrap/config.yaml");
    for line in [
        "kubeconfig: /etc/flexnode/bootstrap/kubeconfig",
        "trustedCAFile: /etc/flexnode/bootstrap/trusted-ca.pem",
        "registryCredentialsFile: /etc/flexnode/bootstrap/registry-credentials.json",
        "installMode: container",
        "agentImage: oci://127.0.0.1:5000/flexnode:0.1.0",
    ] {
        assert!(
            bootstrap.lines().any(|l| l == line),
            "{line} in {bootstrap}"
        );
    }
    let e = flexnode::config::Config::parse(bootstrap, "h").expect_err("files absent here");
    assert_eq!(e.setting, "kubeconfig", "{e}");

    let units = ign["systemd"]["units"].as_array().expect("units");
    assert_eq!(units.len(), 1, "{units:?}");
    assert_eq!(units[0]["name"], "flexnode-bootstrap.service");
    assert_eq!(units[0]["enabled"], true);
    let unit = units[0]["contents"].as_str().expect("contents");
    assert!(
        unit.contains("EnvironmentFile=/etc/flexnode/install.env"),
        "{unit}"
    );
    assert!(unit.contains("RestartPreventExitStatus=78"), "{unit}");
    assert!(
        unit.contains("--hosts-dir /etc/containerd/certs.d"),
        "{unit}"
    );
    for text in [unit, env] {
        assert!(!text.contains("SECRET"), "a secret in {text}");
    }
    let dirs: Vec<(&str, u64)> = ign["storage"]["directories"]
        .as_array()
        .expect("dirs")
        .iter()
        .map(|d| {
            (
                d["path"].as_str().expect("path"),
                d["mode"].as_u64().expect("mode"),
            )
        })
        .collect();
    assert!(
        dirs.contains(&("/etc/flexnode/bootstrap", 0o700)),
        "{dirs:?}"
    );

    // The Butane says the same: the same files, modes, contents and units.
    let bu: Value = serde_saphyr::from_str(&std::fs::read_to_string(&bu_path).expect("read"))
        .expect("butane yaml");
    assert_eq!(bu["variant"], "flatcar");
    assert_eq!(bu["version"], "1.1.0");
    let bu_files = files_of(&bu, |c| c["inline"].as_str().expect("inline").to_string());
    assert_eq!(bu_files, files);
    assert_eq!(bu["systemd"]["units"][0]["contents"], units[0]["contents"]);
    assert_eq!(bu["storage"]["directories"], ign["storage"]["directories"]);
}

/// The validator is not a rubber stamp: a mode that is not a number fails it.
#[test]
fn the_validator_refuses_a_broken_config() {
    let validator = validator();
    let dir = tempfile::tempdir().expect("tmp");
    let broken = dir.path().join("broken.ign");
    std::fs::write(
        &broken,
        r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"relative","mode":"0600"}]}}"#,
    )
    .expect("write");
    let (ok, findings) = validate(&validator, &broken);
    assert!(!ok, "ignition-validate accepted it: {findings}");
}

/// A host-install config, or a container one without a digest, is an impossible setting.
#[test]
fn only_a_container_install_with_a_digest_renders() {
    let dir = tempfile::tempdir().expect("tmp");
    let (config, ..) = inputs(dir.path());
    let text = std::fs::read_to_string(&config).expect("read");
    for (edit, setting) in [
        (
            text.replace("installMode: container\n", "installMode: host\n")
                .replace(&format!("agentImageDigest: sha256:{HEX}\n"), "")
                .replace("agentImage: oci://127.0.0.1:5000/flexnode:0.1.0\n", ""),
            "installMode:",
        ),
        (
            text.replace(&format!("agentImageDigest: sha256:{HEX}\n"), ""),
            "agentImageDigest:",
        ),
    ] {
        let f = private(&dir.path().join("edit.yaml"), &edit);
        let out = dir.path().join("never");
        let r = flexnode(&[
            "ignition",
            "--config",
            f.to_str().expect("path"),
            "--out",
            out.to_str().expect("path"),
        ]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(78), "{stderr}");
        assert!(stderr.contains(setting), "{stderr}");
        assert!(!out.exists(), "nothing is written on a refusal");
    }
}

/// A container install that joins with a bootstrap token: the first boot carries the API
/// server's CA and the token, and a join config naming the API server — no kubeconfig (the
/// node obtains its certificate: src/identity/) — all valid Ignition.
#[test]
fn a_bootstrap_token_join_renders_the_api_servers_ca_and_the_token() {
    let validator = validator();
    let dir = tempfile::tempdir().expect("tmp");
    let ca = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").expect("a PEM bundle");
    let ca_file = dir.path().join("cluster-ca.pem");
    std::fs::write(&ca_file, &ca).expect("ca");
    let token = private(&dir.path().join("token"), "abcdef.0123456789abcdef\n");
    let config = private(
        &dir.path().join("join.yaml"),
        &format!(
            "nodeName: edge-2\napiServer: https://10.0.2.100:6443\napiServerCAFile: {}\n\
             bootstrapTokenFile: {}\nkubernetesVersion: v1.34.12\ninstallMode: container\n\
             agentImage: oci://127.0.0.1:5000/flexnode:0.1.0\nagentImageDigest: sha256:{HEX}\n",
            ca_file.display(),
            token.display()
        ),
    );
    let out = dir.path().join("out");
    let r = flexnode(&[
        "ignition",
        "--config",
        config.to_str().expect("path"),
        "--out",
        out.to_str().expect("path"),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let ign_path = out.join("config.ign");
    let (ok, findings) = validate(&validator, &ign_path);
    assert!(
        ok && findings.trim().is_empty(),
        "ignition-validate: {findings}"
    );
    let ign: Value =
        serde_json::from_str(&std::fs::read_to_string(&ign_path).expect("read")).expect("json");
    let files = files_of(&ign, |c| decode(c["source"].as_str().expect("source")));
    let file = |p: &str| {
        files
            .iter()
            .find(|(path, _, _)| path == p)
            .map(|f| f.2.clone())
    };
    assert_eq!(file("/etc/flexnode/bootstrap/api-server-ca.pem"), Some(ca));
    assert_eq!(
        file("/etc/flexnode/bootstrap/bootstrap-token").as_deref(),
        Some("abcdef.0123456789abcdef\n")
    );
    assert_eq!(file("/etc/flexnode/bootstrap/kubeconfig"), None);
    let join = file("/etc/flexnode/bootstrap/config.yaml").expect("the join config");
    for line in [
        "apiServer: https://10.0.2.100:6443",
        "apiServerCAFile: /etc/flexnode/bootstrap/api-server-ca.pem",
        "bootstrapTokenFile: /etc/flexnode/bootstrap/bootstrap-token",
    ] {
        assert!(join.lines().any(|l| l == line), "{line} in:\n{join}");
    }
    assert!(!join.contains("kubeconfig:"), "{join}");
    // The rendered join config is one `join` accepts on the node.
    let on_node = join
        .replace(
            "/etc/flexnode/bootstrap/api-server-ca.pem",
            &ca_file.display().to_string(),
        )
        .replace(
            "/etc/flexnode/bootstrap/bootstrap-token",
            &token.display().to_string(),
        );
    flexnode::config::Config::parse(&on_node, "h").expect("the rendered join config");
}
