use super::*;
use std::os::unix::fs::PermissionsExt;

fn kubeconfig(dir: &Path, mode: u32) -> PathBuf {
    let p = dir.join("node.kubeconfig");
    std::fs::write(
        &p,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.2.100:6443\nusers:\n- name: u\n  user:\n    token: SECRETTOKEN\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    p
}

fn setting(text: &str) -> String {
    Config::parse(text, "host-a").expect_err("refused").setting
}

#[test]
fn valid_yaml_and_json_with_defaults() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let yaml = format!(
        "kubeconfig: {}\nkubernetesVersion: v1.34.12\n",
        kc.display()
    );
    let c = Config::parse(&yaml, "Host-A\n").expect("valid");
    assert_eq!(c.node_name, "host-a");
    assert_eq!(c.install_mode, InstallMode::Host);
    let json = format!(
        r#"{{"nodeName": "n1", "kubeconfig": "{}", "kubernetesVersion": "v1.33.0", "installMode": "host"}}"#,
        kc.display()
    );
    let c = Config::parse(&json, "x").expect("valid json");
    assert_eq!(c.node_name, "n1");
    let r = c.rendered();
    assert_eq!(r.kubeconfig.as_deref(), Some(Path::new(KUBECONFIG_PATH)));
}

/// The container install names its image by digest, the host install none; no message
/// repeats the reference (it may carry a token).
#[test]
fn the_container_install_names_its_image_by_digest() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let base = format!("kubeconfig: {}\nkubernetesVersion: v1.34.1\n", kc.display());
    let hex = "ab".repeat(32);
    let c = Config::parse(
        &format!(
            "{base}installMode: container\nagentImage: oci://127.0.0.1:5000/flexnode:v1\n\
             agentImageDigest: sha256:{hex}\n"
        ),
        "h",
    )
    .expect("valid");
    assert_eq!(c.install_mode, InstallMode::Container);
    let image = c.agent_image.as_ref().expect("image");
    assert_eq!(
        image.pinned(),
        format!("127.0.0.1:5000/flexnode@sha256:{hex}")
    );
    let r = c.rendered();
    assert_eq!(
        r.agent_image.as_deref(),
        Some("oci://127.0.0.1:5000/flexnode:v1")
    );
    assert_eq!(r.agent_image_digest, Some(format!("sha256:{hex}")));
    let refused = |extra: &str| {
        let e = Config::parse(&format!("{base}{extra}"), "h").expect_err("refused");
        assert!(!e.to_string().contains("SECRET"), "{e}");
        e.setting
    };
    let secret = "oci://r.example/a?token=SECRET";
    for (extra, setting) in [
        (
            format!("installMode: container\nagentImageDigest: {hex}\n"),
            "agentImage",
        ),
        (
            format!("installMode: container\nagentImage: {secret}\nagentImageDigest: {hex}\n"),
            "agentImage",
        ),
        (
            format!(
                "installMode: container\nagentImage: oci://r.example/a@sha256:{hex}\n\
                 agentImageDigest: {hex}\n"
            ),
            "agentImage",
        ),
        (
            "installMode: container\nagentImage: https://r.example/a.tar.gz\n".to_string(),
            "agentImage",
        ),
        (
            "installMode: container\nagentImage: oci://r.example/a\n".to_string(),
            "agentImageDigest",
        ),
        (
            "installMode: container\nagentImage: oci://r.example/a\nagentImageDigest: SECRET\n"
                .to_string(),
            "agentImageDigest",
        ),
        ("agentImage: oci://r.example/a\n".to_string(), "agentImage"),
        (format!("agentImageDigest: {hex}\n"), "agentImageDigest"),
        (
            "agentImageArchive: /var/lib/a.tar\n".to_string(),
            "agentImageArchive",
        ),
    ] {
        assert_eq!(refused(&extra), setting, "{extra}");
    }
    // The image on the node's disk: an absolute path, one plain word (it goes into the
    // bootstrap unit's environment file).
    let container =
        format!("installMode: container\nagentImage: oci://r.example/a\nagentImageDigest: {hex}\n");
    for bad in [
        "a.tar",
        "/var/lib/my image.tar",
        "/x/$HOME.tar",
        "\"/x/a'b.tar\"",
    ] {
        assert_eq!(
            refused(&format!("{container}agentImageArchive: {bad}\n")),
            "agentImageArchive",
            "{bad}"
        );
    }
    let c = Config::parse(
        &format!("{base}{container}agentImageArchive: /var/lib/offline/agent.oci.tar\n"),
        "h",
    )
    .expect("valid");
    let archive = c.agent_image.as_ref().and_then(|a| a.archive.as_deref());
    assert_eq!(archive, Some(Path::new("/var/lib/offline/agent.oci.tar")));
    assert_eq!(c.rendered().agent_image_archive.as_deref(), archive);
}

#[test]
fn impossible_settings_are_named() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let k = kc.display();
    assert_eq!(
        setting(&format!(
            "nodeName: Not_A_Name\nkubeconfig: {k}\nkubernetesVersion: v1.34.1\n"
        )),
        "nodeName"
    );
    assert_eq!(
        setting(&format!("kubeconfig: {k}\nkubernetesVersion: 1.34\n")),
        "kubernetesVersion"
    );
    assert_eq!(setting("kubernetesVersion: v1.34.1\n"), "kubeconfig");
    assert_eq!(
        setting(&format!(
            "kubeconfig: {k}\nkubernetesVersion: v1.34.1\ninstallMode: container\n"
        )),
        "agentImage"
    );
    assert_eq!(
        setting(&format!(
            "kubeconfig: {k}\nkubernetesVersion: v1.34.1\nnodename: x\n"
        )),
        "nodename"
    );
    assert_eq!(
        setting("kubeconfig: relative/path\nkubernetesVersion: v1.34.1\n"),
        "kubeconfig"
    );
    assert_eq!(setting("- not\n- a map\n"), "config");
    let open = kubeconfig(&dir.path().join("."), 0o644);
    let e = Config::parse(
        &format!(
            "kubeconfig: {}\nkubernetesVersion: v1.34.1\n",
            open.display()
        ),
        "h",
    )
    .expect_err("group-readable credential");
    assert!(e.message.contains("chmod 600"), "{e}");
    assert!(!e.to_string().contains("SECRETTOKEN"));
}

#[test]
fn trust_and_registry_credentials_are_checked_at_load() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let base = format!("kubeconfig: {}\nkubernetesVersion: v1.34.1\n", kc.display());
    let file = |name: &str, text: &str, mode: u32| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
        p
    };
    let not_pem = file("ca.txt", "not a certificate", 0o644);
    assert_eq!(
        setting(&format!("{base}trustedCAFile: {}\n", not_pem.display())),
        "trustedCAFile"
    );
    assert_eq!(
        setting(&format!("{base}trustedCAFile: relative.pem\n")),
        "trustedCAFile"
    );
    let secret = r#"{"auths": {"r.example": {"auth": "dTpTM0NSRVQ="}}}"#;
    let open = file("open.json", secret, 0o644);
    let e = Config::parse(
        &format!("{base}registryCredentialsFile: {}\n", open.display()),
        "h",
    )
    .expect_err("readable by others");
    assert_eq!(e.setting, "registryCredentialsFile");
    assert!(e.message.contains("chmod 600"), "{e}");
    let shapeless = file("shapeless.json", r#"{"S3CRET": 1}"#, 0o600);
    let e = Config::parse(
        &format!("{base}registryCredentialsFile: {}\n", shapeless.display()),
        "h",
    )
    .expect_err("no auths");
    assert!(
        e.message.contains("auths") && !e.to_string().contains("S3CRET"),
        "{e}"
    );
    let private = file("auth.json", secret, 0o600);
    let c = Config::parse(
        &format!(
            "{base}registryCredentialsFile: {}\ntrustedCAFile: {}\n",
            private.display(),
            kc.display()
        ),
        "h",
    );
    // A kubeconfig is no certificate either.
    assert_eq!(c.expect_err("not PEM").setting, "trustedCAFile");
    let c = Config::parse(
        &format!("{base}registryCredentialsFile: {}\n", private.display()),
        "h",
    )
    .expect("valid");
    assert_eq!(
        c.registry_credentials_file.as_deref(),
        Some(private.as_path())
    );
    let r = c.rendered();
    assert_eq!(
        r.registry_credentials_file.as_deref(),
        Some(Path::new(REGISTRY_CREDENTIALS_PATH))
    );
    assert_eq!(r.trusted_ca_file, None);
}

#[test]
fn dns_names() {
    assert!(is_dns_subdomain("node-a.example"));
    for bad in ["", "-a", "a-", "A", "a_b", "a..b", &"a".repeat(64)] {
        assert!(!is_dns_subdomain(bad), "{bad:?}");
    }
}

/// A kubeconfig with the cluster CA inline, as the kubelet settings need.
pub(super) fn kubeconfig_with_ca(dir: &Path) -> PathBuf {
    let p = dir.join("ca.kubeconfig");
    std::fs::write(
        &p,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.2.100:6443\n    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\nusers:\n- name: u\n  user:\n    token: SECRETTOKEN\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
    )
    .expect("write");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

#[test]
fn node_images_come_with_the_kubelet_settings_and_cover_the_goal() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig_with_ca(dir.path());
    let token = dir.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let hex = "ab".repeat(32);
    let base = format!(
        "kubeconfig: {}\nkubernetesVersion: v1.34.12\n",
        kc.display()
    );
    let images = format!(
        "nodeImages:\n  v1.34.12: oci://r.example:5000/node:v1.34@sha256:{hex}\n  \
         v1.33.9: oci://r.example:5000/node@sha256:{hex}\n"
    );
    let full = format!("{base}{images}bootstrapTokenFile: {}\n", token.display());
    let c = Config::parse(&full, "h").expect("valid");
    let node = c.node.clone().expect("node settings");
    assert_eq!(node.images.pins.len(), 2);
    assert_eq!(
        node.images.pins["v1.34.12"].pinned(),
        format!("r.example:5000/node@sha256:{hex}")
    );
    assert_eq!(node.sandbox_image, DEFAULT_SANDBOX_IMAGE);
    assert_eq!(node.pod_cidr, DEFAULT_POD_CIDR);
    // Rendered at the installed token path, and read back the same.
    let r = c.rendered();
    assert_eq!(
        r.bootstrap_token_file.as_deref(),
        Some(Path::new(BOOTSTRAP_TOKEN_PATH))
    );
    assert_eq!(
        r.node_images.as_ref().map(|m| m["v1.34.12"].clone()),
        Some(format!("oci://r.example:5000/node:v1.34@sha256:{hex}"))
    );

    let refused = |text: &str| {
        let e = Config::parse(text, "h").expect_err("refused");
        assert!(!e.to_string().contains("SECRET"), "{e}");
        assert!(!e.to_string().contains("0123456789abcdef"), "{e}");
        e.setting
    };
    let with_token = |extra: &str| format!("{full}{extra}");
    // The goal's version has no image.
    let other = format!(
        "{base}nodeImages:\n  v1.33.9: oci://r.example/node@sha256:{hex}\nbootstrapTokenFile: {}\n",
        token.display()
    );
    assert_eq!(refused(&other), "nodeImages");
    // Not pinned, not a version, not an oci reference.
    for images in [
        "nodeImages:\n  v1.34.12: oci://r.example/node:v1\n".to_string(),
        format!(
            "nodeImages:\n  v1.34.12: oci://r.example/node@sha256:{hex}\n  latest: oci://r.example/node@sha256:{hex}\n"
        ),
        format!("nodeImages:\n  v1.34.12: https://r.example/node@sha256:{hex}\n"),
    ] {
        let text = format!("{base}{images}bootstrapTokenFile: {}\n", token.display());
        assert!(refused(&text).starts_with("nodeImages"), "{images}");
    }
    assert_eq!(refused(&format!("{base}{images}")), "bootstrapTokenFile");
    assert_eq!(
        refused(&with_token("sandboxImage: \"pause\\\"x\"\n")),
        "sandboxImage"
    );
    // Pinned by digest, as every image the node pulls; a tag alone could change under it.
    for tagged in [
        "r.example/pause:3.10",
        "r.example/pause@sha256:1234",
        "r.example/pause:sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
    ] {
        let e = Config::parse(&with_token(&format!("sandboxImage: {tagged}\n")), "h")
            .expect_err("refused");
        assert_eq!(e.setting, "sandboxImage", "{tagged}");
        assert!(e.message.contains("digest"), "{tagged}: {e}");
    }
    assert_eq!(refused(&with_token("podCIDR: 10.88.0.0/40\n")), "podCIDR");
    assert_eq!(refused(&with_token("podCIDR: Cluster\n")), "podCIDR");
    let from_cluster = Config::parse(&with_token("podCIDR: cluster\n"), "h").expect("valid");
    assert_eq!(from_cluster.node.expect("node").pod_cidr, "cluster");
    // The token alone is the agent's (it renews through it: src/identity/); the kubelet's
    // other settings need node images.
    let alone = format!("{base}bootstrapTokenFile: {}\n", token.display());
    let c = Config::parse(&alone, "h").expect("a token without node images");
    assert!(c.node.is_none() && c.bootstrap_token_file.is_some());
    for (extra, setting) in [
        (
            "sandboxImage: r.example/pause:3.10\n".to_string(),
            "sandboxImage",
        ),
        ("podCIDR: 10.88.0.0/16\n".to_string(), "podCIDR"),
    ] {
        assert_eq!(refused(&format!("{base}{extra}")), setting, "{extra}");
    }
    // A token file others can read, or one without a token.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(refused(&full), "bootstrapTokenFile");
    std::fs::write(&token, "SECRET\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    assert_eq!(refused(&full), "bootstrapTokenFile");
    // A kubeconfig without the cluster CA cannot give the kubelet one.
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    let no_ca = kubeconfig(dir.path(), 0o600);
    let text = full.replace(&kc.display().to_string(), &no_ca.display().to_string());
    assert_eq!(refused(&text), "kubeconfig");
}

/// `nodeImages` without `bootstrapTokenFile`: the kubelet runs the agent's `flexnode token`,
/// whose files must be where the agent's unit sees them.
#[test]
fn the_kubelet_runs_the_agents_exec_plugin_without_a_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let hex = "ab".repeat(32);
    let exec = dir.path().join("exec.kubeconfig");
    let parse = |args: &str| {
        std::fs::write(
            &exec,
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.2.100:6443\n    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\nusers:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: flexnode\n      args: [token, {args}]\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"),
        )
        .expect("write");
        std::fs::set_permissions(&exec, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        Config::parse(
            &format!(
                "kubeconfig: {}\nkubernetesVersion: v1.34.12\nnodeImages:\n  v1.34.12: oci://r.example/node@sha256:{hex}\n",
                exec.display()
            ),
            "h",
        )
    };
    let c = parse("--metadata-url, 'http://169.254.169.254/token'")
        .expect("the kubelet runs the agent's plugin");
    assert!(c.node.is_some() && c.bootstrap_token_file.is_none());
    // A file the plugin reads where the agent's unit cannot see it (ProtectHome=).
    let e = parse("--client-secret-file=/root/secret").expect_err("hidden");
    assert!(
        e.to_string().contains("/root/secret") && e.to_string().contains("ProtectHome"),
        "{e}"
    );
}

/// A kubeconfig that would not verify the API server is an impossible setting: TLS
/// verification is never turned off silently, and the server (which may carry credentials in
/// its URL) is not echoed.
#[test]
fn a_kubeconfig_that_skips_tls_verification_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = std::fs::read_to_string(kubeconfig(dir.path(), 0o600)).expect("read");
    for (name, text) in [
        (
            "insecure",
            good.replace(
                "    server: https://10.0.2.100:6443\n",
                "    server: https://10.0.2.100:6443\n    insecure-skip-tls-verify: true\n",
            ),
        ),
        (
            "http",
            good.replace(
                "https://10.0.2.100:6443",
                "http://u:SECRETPW@10.0.2.100:8080",
            ),
        ),
    ] {
        assert_ne!(text, good, "{name}");
        let path = dir.path().join(name);
        std::fs::write(&path, &text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let e = Config::parse(
            &format!(
                "kubeconfig: {}\nkubernetesVersion: v1.34.1\n",
                path.display()
            ),
            "h",
        )
        .expect_err(name);
        assert_eq!(e.setting, "kubeconfig", "{name}: {e}");
        assert!(!e.to_string().contains("SECRET"), "{name}: {e}");
        assert!(
            e.message.contains("insecure-skip-tls-verify") || e.message.contains("https://"),
            "{name}: {e}"
        );
    }
}

#[test]
fn metrics_are_served_on_loopback_only() {
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let with = |addr: &str| {
        Config::parse(
            &format!(
                "kubeconfig: {}\nkubernetesVersion: v1.34.12\nmetricsAddress: \"{addr}\"\n",
                kc.display()
            ),
            "host-a",
        )
    };
    let c = with("127.0.0.1:9464").expect("loopback");
    assert_eq!(
        c.metrics_address,
        Some("127.0.0.1:9464".parse().expect("addr"))
    );
    assert_eq!(
        c.rendered().metrics_address.as_deref(),
        Some("127.0.0.1:9464")
    );
    assert!(with("[::1]:9464").is_ok());
    for (addr, says) in [
        ("0.0.0.0:9464", "not a loopback address"),
        ("10.0.2.15:9464", "not a loopback address"),
        ("localhost:9464", "is not IP:PORT"),
        ("127.0.0.1", "is not IP:PORT"),
    ] {
        let e = with(addr).expect_err(addr);
        assert_eq!(e.setting, "metricsAddress", "{addr}");
        assert!(e.message.contains(says), "{addr}: {e}");
        assert!(!e.message.contains("  "), "one line, single spaces: {e}");
    }
    let c = Config::parse(
        &format!(
            "kubeconfig: {}\nkubernetesVersion: v1.34.12\n",
            kc.display()
        ),
        "host-a",
    )
    .expect("valid");
    assert_eq!(c.metrics_address, None, "off by default");
}

#[test]
fn keys_that_are_no_settings_name_are_not_quoted() {
    let secret = "oci://user:S3CR3T@registry.example/x";
    for text in [
        format!("{{{secret}: 1, {secret}: 2}}"),
        format!("{secret}: 1\n"),
        format!("{{\"{secret}\": 1}}"),
        format!("{{\"a/`{secret}\": 1}}"),
    ] {
        let e = Config::parse(&text, "h").expect_err("refused");
        assert_eq!(e.setting, "config", "{e}");
        assert!(!e.to_string().contains("S3CR3T"), "{text}: {e}");
    }
    // A typo is still named.
    let e = Config::parse("kubeconfg: /x\n", "h").expect_err("refused");
    assert_eq!(e.setting, "kubeconfg", "{e}");
}

#[test]
fn a_missing_or_garbled_config_is_told_apart_from_a_bad_setting() {
    let dir = tempfile::tempdir().expect("tmp");
    let missing = dir.path().join("config.yaml");
    let kind = |p: &Path| Config::installed(p, "host").err().map(|f| f.kind);
    assert_eq!(kind(&missing), Some(FaultKind::ConfigMissing));
    std::fs::write(&missing, [0xff, 0xfe, 0x00, 0x80]).expect("write");
    assert_eq!(kind(&missing), Some(FaultKind::ConfigUnreadable));
    assert_eq!(kind(dir.path()), Some(FaultKind::ConfigUnreadable));
    std::fs::write(&missing, "nodeName: Not_A_Name\n").expect("write");
    assert_eq!(kind(&missing), Some(FaultKind::ConfigInvalid));
}

/// Joining with a bootstrap token: the API server, its CA and the token, no kubeconfig; the
/// installed file names the kubeconfig `join` obtains, and no API server.
#[test]
fn a_bootstrap_token_join_names_the_api_server_its_ca_and_the_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let ca = dir.path().join("ca.crt");
    let pem = rcgen::CertificateParams::new(Vec::<String>::new())
        .expect("params")
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert")
        .pem();
    std::fs::write(&ca, pem).expect("ca");
    let join = format!(
        "kubernetesVersion: v1.34.1\napiServer: https://10.0.2.100:6443\napiServerCAFile: {}\n\
         bootstrapTokenFile: {}\n",
        ca.display(),
        token.display()
    );
    let c = Config::parse(&join, "h").expect("valid");
    assert_eq!(c.kubeconfig, Path::new(KUBECONFIG_PATH));
    let t = c.token_join.as_ref().expect("a token join");
    assert_eq!(
        (t.server.as_str(), t.ca_file.as_path()),
        ("https://10.0.2.100:6443", ca.as_path())
    );
    let r = c.rendered();
    assert_eq!(r.kubeconfig.as_deref(), Some(Path::new(KUBECONFIG_PATH)));
    assert_eq!(
        r.bootstrap_token_file.as_deref(),
        Some(Path::new(BOOTSTRAP_TOKEN_PATH))
    );
    assert!(r.api_server.is_none() && r.api_server_ca_file.is_none());
    let with_life = Config::parse(
        &format!("{join}agentCertificateExpirationSeconds: 86400\n"),
        "h",
    )
    .expect("valid");
    assert_eq!(with_life.agent_certificate_expiration_seconds, Some(86400));
    assert_eq!(
        with_life.rendered().agent_certificate_expiration_seconds,
        Some(86400)
    );

    let kc = kubeconfig(dir.path(), 0o600);
    let refused = |text: String| {
        let e = Config::parse(&text, "h").expect_err("refused");
        assert!(
            !e.to_string().contains("0123456789abcdef") && !e.to_string().contains("hunter2"),
            "{e}"
        );
        e.setting
    };
    let server = "https://10.0.2.100:6443";
    for (text, setting) in [
        (format!("{join}kubeconfig: {}\n", kc.display()), "apiServer"),
        (join.replace(server, "http://10.0.2.100:6443"), "apiServer"),
        (
            join.replace(server, "https://admin:hunter2@10.0.2.100:6443"),
            "apiServer",
        ),
        (join.replace(server, "10.0.2.100:6443"), "apiServer"),
        (
            join.replace(&format!("apiServerCAFile: {}\n", ca.display()), ""),
            "apiServerCAFile",
        ),
        (
            join.replace(&ca.display().to_string(), &token.display().to_string()),
            "apiServerCAFile",
        ),
        (
            join.replace(&format!("bootstrapTokenFile: {}\n", token.display()), ""),
            "bootstrapTokenFile",
        ),
        (
            format!("{join}agentCertificateExpirationSeconds: 599\n"),
            "agentCertificateExpirationSeconds",
        ),
        (
            format!(
                "kubernetesVersion: v1.34.1\nkubeconfig: {}\napiServerCAFile: {}\n",
                kc.display(),
                ca.display()
            ),
            "apiServerCAFile",
        ),
    ] {
        assert_eq!(refused(text.clone()), setting, "{text}");
    }
    // Where in its life the certificate is renewed.
    assert_eq!(c.renew_at, RenewAt::default());
    let early = Config::parse(
        &format!("{join}agentCertificateRenewAtPercent: [50, 60]\n"),
        "h",
    )
    .expect("valid");
    let at = RenewAt {
        from_percent: 50,
        to_percent: 60,
    };
    assert_eq!(early.renew_at, at);
    assert_eq!(
        early.rendered().agent_certificate_renew_at_percent,
        Some([50, 60])
    );
    assert_eq!(
        (at.point(1000, 2000, 0.0), at.point(1000, 2000, 1.0)),
        (1500, 1600)
    );
    for bad in ["[60, 50]", "[0, 50]", "[50, 100]", "[50]"] {
        let text = format!("{join}agentCertificateRenewAtPercent: {bad}\n");
        let e = Config::parse(&text, "h").expect_err(bad);
        assert!(
            e.setting.starts_with("agentCertificateRenewAtPercent") || e.setting == "config",
            "{bad}: {e}"
        );
    }
    let e = Config::parse("kubernetesVersion: v1.34.1\n", "h").expect_err("no credential");
    assert_eq!(e.setting, "kubeconfig");
    assert!(e.message.contains("apiServer"), "{e}");
}

/// `drain`: the defaults a cautious operator would choose, each key overridable, a value it
/// cannot read refused by name; the installed configuration keeps what differs.
#[test]
fn drain_settings() {
    use crate::lifecycle::drain::{DrainPolicy, OnTimeout};
    let dir = tempfile::tempdir().expect("tmp");
    let kc = kubeconfig(dir.path(), 0o600);
    let base = format!(
        "kubeconfig: {}\nkubernetesVersion: v1.34.12\n",
        kc.display()
    );
    let c = Config::parse(&base, "x").expect("valid");
    assert_eq!(c.drain, DrainPolicy::default());
    assert_eq!(c.rendered().drain, None);
    let set = format!(
        "{base}drain: {{enabled: true, timeout: 1h30m, onTimeout: Proceed, deleteEmptyDirData: true}}\n"
    );
    let c = Config::parse(&set, "x").expect("valid");
    assert_eq!(
        (
            c.drain.timeout_secs,
            c.drain.on_timeout,
            c.drain.delete_emptydir_data
        ),
        (5400, OnTimeout::Proceed, true)
    );
    let again = serde_saphyr::to_string(&c.rendered()).expect("yaml");
    assert!(again.contains("onTimeout: Proceed"), "{again}");
    let back = Config::parse(
        &again.replace(KUBECONFIG_PATH, &kc.display().to_string()),
        "x",
    )
    .expect("the installed configuration reads back");
    assert_eq!(back.drain, c.drain);
    assert_eq!(
        setting(&format!("{base}drain: {{timeout: soon}}\n")),
        "drain.timeout"
    );
    assert_eq!(
        setting(&format!("{base}drain: {{onTimeout: fail}}\n")),
        "drain.onTimeout"
    );
    let unknown = Config::parse(&format!("{base}drain: {{evict: all}}\n"), "x");
    assert!(unknown.is_err(), "an unknown drain key is refused");
}
