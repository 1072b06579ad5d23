//! The kubelet's settings (src/effects/host/kubelet.rs): what each file says, what is refused.

use super::*;

fn settings(token: &str) -> KubeletSettings<'_> {
    KubeletSettings {
        node_name: "edge-07",
        server: "https://10.0.2.100:6443",
        ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        credential: KubeletCredential::BootstrapToken(token),
        sandbox_image: "10.0.2.100:5000/lab/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
        pod_cidr: "10.88.0.0/16",
        node_ip: Some(std::net::IpAddr::from([10, 0, 2, 15])),
        registries: vec![RegistryAccess {
            host: "10.0.2.100:5000".into(),
            auth: Some("dXNlcjpwdw==".into()),
        }],
        registry_ca_pem: Some(b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"),
        restrict_oom_score_adj: false,
        node: &NO_SETTINGS,
        tuning: &NO_TUNING,
    }
}

static NO_SETTINGS: NodeSettings = NodeSettings {
    labels: std::collections::BTreeMap::new(),
    taints: Vec::new(),
};
static NO_TUNING: std::sync::LazyLock<KubeletTuning> =
    std::sync::LazyLock::new(KubeletTuning::default);

fn toml_of(s: &KubeletSettings) -> String {
    let files = machine_files(s).expect("files");
    let f = files
        .iter()
        .find(|f| f.path.ends_with("config.toml"))
        .expect("containerd config");
    String::from_utf8(f.contents.clone()).expect("utf-8")
}

#[test]
fn pods_oom_scores_are_restricted_only_where_the_host_cannot_lower_them() {
    let mut s = settings("abcdef.0123456789abcdef");
    assert!(toml_of(&s).contains("  restrict_oom_score_adj = false\n"));
    s.restrict_oom_score_adj = true;
    let toml = toml_of(&s);
    let cri = toml
        .split("\n[")
        .find(|t| t.starts_with("plugins.\"io.containerd.grpc.v1.cri\"]"))
        .expect("the CRI table");
    assert!(cri.ends_with("\n  restrict_oom_score_adj = true"), "{toml}");
}

#[test]
fn a_pod_range_from_the_cluster_is_a_template_containerd_renders_with_the_nodes_range() {
    let mut s = settings("abcdef.0123456789abcdef");
    let fixed = machine_files(&s).expect("files");
    assert!(
        fixed
            .iter()
            .any(|f| f.path.ends_with("10-flexnode.conflist"))
    );
    assert!(!toml_of(&s).contains("conf_template"));
    assert!(
        !fixed
            .iter()
            .any(|f| f.path.to_string_lossy().contains("pod-bridge")),
        "a fixed range is the same on both sides: no bridge to reset"
    );
    s.pod_cidr = POD_RANGE_FROM_CLUSTER;
    let files = machine_files(&s).expect("files");
    assert!(!files.iter().any(|f| f.path.starts_with("etc/cni")));
    let reset = files
        .iter()
        .find(|f| {
            f.path
                .ends_with("containerd.service.d/flexnode-pod-bridge.conf")
        })
        .expect("containerd's drop-in");
    assert!(String::from_utf8_lossy(&reset.contents).contains(
        "Wants=flexnode-pod-bridge-reset.service\nAfter=flexnode-pod-bridge-reset.service\n"
    ));
    assert_eq!(
        files.last().map(|f| f.path.as_path()),
        Some(Path::new(KUBELET_ENV)),
        "the kubelet's arguments stay last"
    );
    let template = files
        .iter()
        .find(|f| f.path.ends_with("flexnode-cni.template"))
        .expect("the template");
    let text = String::from_utf8(template.contents.clone()).expect("utf-8");
    assert!(
        text.contains(r#""ranges":[[{"subnet":"{{.PodCIDR}}"}]]"#),
        "{text}"
    );
    assert!(
        toml_of(&s).contains("\n  conf_template = \"/etc/containerd/flexnode-cni.template\"\n")
    );
    s.pod_cidr = "clusters";
    assert_eq!(
        machine_files(&s),
        Err(KubeletSettingsError::PodCidr("clusters".into()))
    );
}

#[test]
fn the_bounding_set_tells_whether_oom_scores_can_be_lowered() {
    let full = "Name:\tsystemd\nCapBnd:\t000001ffffffffff\nCapAmb:\t0\n";
    let without = "Name:\tsystemd\nCapBnd:\t000001fffeffffff\nCapAmb:\t0\n";
    assert!(can_lower_oom_scores(full));
    assert!(!can_lower_oom_scores(without));
    assert!(can_lower_oom_scores("Name:\tinit\n"));
    assert!(can_lower_oom_scores("CapBnd:\tzz\n"));
}

#[test]
fn the_token_is_only_in_the_bootstrap_kubeconfig_which_is_private() {
    let token = "abcdef.0123456789abcdef";
    let files = machine_files(&settings(token)).expect("files");
    for f in &files {
        let text = String::from_utf8_lossy(&f.contents);
        let holds = text.contains(token);
        assert_eq!(
            holds,
            f.path.ends_with("bootstrap.kubeconfig"),
            "{}",
            f.path.display()
        );
        if holds {
            assert_eq!(f.mode, 0o600);
        }
    }
    assert_eq!(
        files.last().map(|f| f.path.as_path()),
        Some(std::path::Path::new(KUBELET_ENV))
    );
    let env = files
        .last()
        .map(|f| String::from_utf8_lossy(&f.contents).into_owned());
    assert!(
        env.as_deref()
            .is_some_and(|e| e.contains(" --hostname-override=edge-07 --node-ip=10.0.2.15\n")),
        "{env:?}"
    );
}

#[test]
fn bad_settings_are_refused_without_quoting_the_token() {
    let bad = "ABCDEF.0123456789abcdef";
    let e = machine_files(&settings(bad)).expect_err("upper case");
    assert_eq!(e, KubeletSettingsError::BootstrapToken);
    assert!(!e.to_string().contains(bad));
    let mut s = settings("abcdef.0123456789abcdef");
    s.sandbox_image = "pause\"\n[evil]";
    assert!(matches!(
        machine_files(&s),
        Err(KubeletSettingsError::SandboxImage(_))
    ));
    let mut s = settings("abcdef.0123456789abcdef");
    s.pod_cidr = "10.88.0.0/33";
    assert!(matches!(
        machine_files(&s),
        Err(KubeletSettingsError::PodCidr(_))
    ));
    let mut s = settings("abcdef.0123456789abcdef");
    s.server = "http://10.0.2.100:6443";
    assert_eq!(machine_files(&s), Err(KubeletSettingsError::Server));
}

#[test]
fn registry_passwords_make_containerd_s_file_private_and_stay_out_of_the_rest() {
    let files = machine_files(&settings("abcdef.0123456789abcdef")).expect("files");
    let config = files
        .iter()
        .find(|f| f.path.ends_with("config.toml"))
        .expect("containerd config");
    let text = String::from_utf8_lossy(&config.contents);
    assert!(
        text.contains("registry.configs.\"10.0.2.100:5000\".auth]"),
        "{text}"
    );
    assert!(
        text.contains("ca_file = \"/etc/containerd/flexnode-registry-ca.pem\""),
        "{text}"
    );
    assert_eq!(config.mode, 0o600);
    for f in files.iter().filter(|f| !f.path.ends_with("config.toml")) {
        assert!(!String::from_utf8_lossy(&f.contents).contains("dXNlcjpwdw=="));
    }
    let mut s = settings("abcdef.0123456789abcdef");
    s.registries[0].host = "evil\"]\n[x".into();
    assert!(matches!(
        machine_files(&s),
        Err(KubeletSettingsError::Registry(_))
    ));
}

#[test]
fn files_from_reads_the_token_and_the_credentials_for_the_sandbox_registry() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    let creds = dir.path().join("creds.json");
    std::fs::write(
        &creds,
        r#"{"auths": {"10.0.2.100:5000": {"username": "u", "password": "p"}}}"#,
    )
    .expect("creds");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nMIIC\n").expect("ca");
    let inputs = KubeletInputs {
        node_name: "edge-07".into(),
        server: "https://10.0.2.100:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\n".to_vec(),
        credential: KubeletSource::BootstrapTokenFile(token),
        trusted_ca_file: Some(ca),
        registry_credentials_file: Some(creds),
        sandbox_image: "registry.example/pause:3.10@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a".into(),
        sandbox_image_archive: None,
        pod_cidr: "10.88.0.0/16".into(),
        tuning: KubeletTuning::default(),
    };
    let files = files_from(&inputs, &NO_SETTINGS).expect("files");
    let config = files
        .iter()
        .find(|f| f.path.ends_with("config.toml"))
        .expect("config");
    let text = String::from_utf8_lossy(&config.contents);
    // base64("u:p"); the sandbox image's registry trusts the CA too, without credentials.
    assert!(text.contains("auth = \"dTpw\""), "{text}");
    assert!(text.contains("configs.\"registry.example\".tls]"), "{text}");
    assert!(
        !text.contains("configs.\"registry.example\".auth]"),
        "{text}"
    );
    let kubeconfig = files
        .iter()
        .find(|f| f.path.ends_with("bootstrap.kubeconfig"))
        .expect("bootstrap");
    assert!(String::from_utf8_lossy(&kubeconfig.contents).contains("abcdef.0123456789abcdef"));
}

/// An OCI archive (a tar) whose index names `digest` as tag `tag`.
fn sandbox_archive(at: &Path, digest: &str, tag: &str) {
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:{digest}","size":1,"annotations":{{"org.opencontainers.image.ref.name":"{tag}"}}}}]}}"#
    );
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in [
        ("oci-layout", r#"{"imageLayoutVersion":"1.0.0"}"#.as_bytes()),
        ("index.json", index.as_bytes()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, data).expect("tar");
    }
    std::fs::write(at, b.into_inner().expect("tar")).expect("archive");
}

#[test]
fn an_offline_sandbox_image_is_copied_in_and_imported_before_the_kubelet() {
    let dir = tempfile::tempdir().expect("tmp");
    let token = dir.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    let hex = "ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a";
    let archive = dir.path().join("pause.oci.tar");
    sandbox_archive(&archive, hex, "3.10");
    let mut inputs = KubeletInputs {
        node_name: "edge-07".into(),
        server: "https://10.0.2.100:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\n".to_vec(),
        credential: KubeletSource::BootstrapTokenFile(token),
        trusted_ca_file: None,
        registry_credentials_file: None,
        sandbox_image: format!("registry.example/pause:3.10@sha256:{hex}"),
        sandbox_image_archive: Some(archive.clone()),
        pod_cidr: "10.88.0.0/16".into(),
        tuning: KubeletTuning::default(),
    };
    let files = files_from(&inputs, &NO_SETTINGS).expect("files");
    let copied = files
        .iter()
        .find(|f| f.path == Path::new(super::super::sandbox_archive::SANDBOX_ARCHIVE))
        .expect("the archive in the machine");
    assert_eq!(copied.contents, std::fs::read(&archive).expect("read"));
    let drop_in = files
        .iter()
        .find(|f| f.path == Path::new(super::super::sandbox_archive::SANDBOX_IMPORT_DROP_IN))
        .expect("the import");
    let text = String::from_utf8_lossy(&drop_in.contents);
    assert!(
        text.contains(
            "ExecStartPre=/usr/bin/ctr --namespace k8s.io images import --digests --base-name \
             registry.example/pause /var/lib/flexnode/sandbox-image.oci.tar"
        ),
        "{text}"
    );
    // The kubelet's arguments stay last (its unit is conditioned on them).
    assert!(files.last().expect("files").path.ends_with("kubelet.env"));

    // An archive of another image is refused, naming both.
    sandbox_archive(&archive, &"ab".repeat(32), "3.10");
    let m = files_from(&inputs, &NO_SETTINGS)
        .expect_err("another image")
        .to_string();
    assert!(m.contains(&"ab".repeat(32)) && m.contains(hex), "{m}");
    inputs.sandbox_image_archive = Some(dir.path().join("absent.tar"));
    let m = files_from(&inputs, &NO_SETTINGS)
        .expect_err("absent")
        .to_string();
    assert!(m.contains("absent.tar"), "{m}");
}

#[test]
fn the_kubelet_starts_from_the_plugin_with_no_token_and_no_certificate_to_rotate() {
    use super::super::kubelet_plugin::kubelet_plugin;
    let plugin = kubelet_plugin(
        &[
            "--metadata-url".to_string(),
            "http://169.254.169.254/identity?client_id=a".to_string(),
        ],
        Path::new("/x"),
    )
    .expect("plugin");
    let files = machine_files(&KubeletSettings {
        node_name: "edge-07",
        server: "https://10.0.2.100:6443",
        ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        credential: KubeletCredential::Exec(&plugin),
        sandbox_image: "10.0.2.100:5000/lab/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
        pod_cidr: "10.88.0.0/16",
        node_ip: None,
        registries: Vec::new(),
        registry_ca_pem: None,
        restrict_oom_score_adj: false,
        node: &NO_SETTINGS,
        tuning: &NO_TUNING,
    })
    .expect("files");
    let text = |end: &str| {
        files
            .iter()
            .find(|f| f.path.ends_with(end))
            .map(|f| (String::from_utf8_lossy(&f.contents).into_owned(), f.mode))
    };
    assert!(text("bootstrap.kubeconfig").is_none());
    let (kubeconfig, mode) = text("kubelet.kubeconfig").expect("the kubelet's kubeconfig");
    assert_eq!(mode, 0o600);
    let v: serde_json::Value = serde_json::from_str(&kubeconfig).expect("json");
    let exec = &v["users"][0]["user"]["exec"];
    assert_eq!(exec["command"], "/usr/local/libexec/flexnode/flexnode");
    assert_eq!(exec["args"][0], "token");
    let (env, _) = text("kubelet.env").expect("the kubelet's arguments");
    assert!(
        env.contains("--kubeconfig=/etc/kubernetes/kubelet.kubeconfig")
            && !env.contains("bootstrap"),
        "{env}"
    );
    let (config, _) = text("kubelet.yaml").expect("the kubelet's configuration");
    assert!(config.contains(r#""rotateCertificates":false"#), "{config}");
}
