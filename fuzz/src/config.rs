//! Target `config`: the configuration file (`src/config/`), YAML or JSON, as `flexnode join
//! --config` and the daemon read it. A refusal names its setting and never shows a file's
//! contents or an image reference's secret; an accepted file is well formed and the file
//! `join` installs from it (`Config::rendered`) reads back as the same configuration.
//!
//! Input: the file's text; `@FILES@` stands for a directory of valid files it may name
//! (`kubeconfig`, `ca.pem`, `registry.json`, `token`, `agent.tar`).

use crate::common::{MARKER, Outcome, text};
use flexnode::config::{Config, ConfigFile, is_dns_subdomain};
use flexnode::lifecycle::agent::InstallMode;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// In every file the configuration may name: none of it may reach a message.
const FILE_SECRET: &str = "F1LES3CR3T";
const TOKEN: &str = "abcdef.0123456789abcdef";
const HOSTNAME: &str = "Fuzz-Host";

pub fn check(data: &[u8], scratch: &Path) -> Outcome {
    let files = files(scratch);
    let text = text(data).replace("@FILES@", &files.display().to_string());
    let result = Config::parse(&text, HOSTNAME);
    match &result {
        Err(e) => check_refusal(e),
        Ok(config) => check_config(config),
    }
    Outcome::from(&result)
}

fn check_refusal(e: &flexnode::config::ConfigError) {
    let shown = format!("{e} {e:?}");
    for secret in [FILE_SECRET, &TOKEN[7..]] {
        assert!(
            !shown.contains(secret),
            "a refusal shows a file's contents: {shown}"
        );
    }
    // Settings whose refusal quotes the value on purpose (names, versions, paths): none can
    // hold a URL. Every other refusal, the parser's included, shows no value at all.
    let quotes_value = [
        "nodeName",
        "kubernetesVersion",
        "podCIDR",
        "nodeImages",
        "kubeconfig",
        "trustedCAFile",
        "registryCredentialsFile",
        "bootstrapTokenFile",
    ]
    .contains(&e.setting.as_str())
        // An unknown key that looks like a setting's name is quoted to name the typo (it is
        // then the refusal's setting): a key, not a value.
        || (e.message.contains("unknown field") && e.setting != "config");
    if !quotes_value {
        assert!(
            !e.message.contains(MARKER),
            "setting {}: the refusal shows a value: {shown}",
            e.setting
        );
    }
    assert!(
        !e.to_string().contains('\n'),
        "a refusal spans lines: {shown}"
    );
}

fn check_config(config: &Config) {
    assert!(
        is_dns_subdomain(&config.node_name),
        "{:?}",
        config.node_name
    );
    assert_eq!(
        config.agent_image.is_some(),
        config.install_mode == InstallMode::Container,
        "{config:?}"
    );
    if let Some(node) = &config.node {
        assert!(
            node.images.pins.contains_key(&config.kubernetes_version)
                || node.images.pattern.is_some(),
            "{config:?}"
        );
    }
    // A bootstrap token join installs the kubeconfig it obtains (src/identity/bootstrap.rs),
    // which no file here stands for: the installed file names it and no API server.
    if config.token_join.is_some() {
        let rendered = config.rendered();
        assert!(rendered.api_server.is_none() && rendered.api_server_ca_file.is_none());
        assert!(rendered.bootstrap_token_file.is_some(), "{config:?}");
        return;
    }
    // What `join` writes (src/cli/join.rs), with the copied files where they are here.
    let installed = ConfigFile {
        kubeconfig: Some(config.kubeconfig.clone()),
        trusted_ca_file: config.trusted_ca_file.clone(),
        registry_credentials_file: config.registry_credentials_file.clone(),
        bootstrap_token_file: config.bootstrap_token_file.clone(),
        ..config.rendered()
    };
    let yaml = serde_saphyr::to_string(&installed).expect("render the installed config");
    let text = format!("# Written by `flexnode join`; see docs/config.md.\n{yaml}");
    match Config::parse(&text, "other-host") {
        Ok(again) => assert_eq!(
            &again, config,
            "the installed file reads differently:\n{text}"
        ),
        Err(e) => panic!("the installed file is refused ({e}):\n{text}"),
    }
}

/// The valid files `@FILES@` names, written once per scratch directory.
fn files(scratch: &Path) -> PathBuf {
    let dir = scratch.join("files");
    if dir.join("done").exists() {
        return dir;
    }
    std::fs::create_dir_all(&dir).expect("create the files directory");
    let write = |name: &str, contents: &[u8], mode: u32| {
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write a config file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    write(
        "kubeconfig",
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
             https://127.0.0.1:6443\n    certificate-authority-data: eA==\nusers:\n- name: u\n  \
             user:\n    token: {FILE_SECRET}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    \
             user: u\ncurrent-context: x\n"
        )
        .as_bytes(),
        0o600,
    );
    // The system's CA bundle is a real PEM file; without one, the setting is refused.
    let ca = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    write("ca.pem", &ca, 0o644);
    write(
        "registry.json",
        format!(r#"{{"auths": {{"r.example": {{"auth": "dTp{FILE_SECRET}"}}}}}}"#).as_bytes(),
        0o600,
    );
    write("token", format!("{TOKEN}\n").as_bytes(), 0o600);
    write("agent.tar", b"not read at load", 0o600);
    write("done", b"", 0o600);
    dir
}
