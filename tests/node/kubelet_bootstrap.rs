//! The cluster side a node's kubelet needs, against the real control plane
//! (`e2e/controlplane/run`, with kube-controller-manager and kube-scheduler) and the real
//! kubelet built from the same pinned modules: a bootstrap token gets the kubelet a client
//! certificate (TLS bootstrap: its CSR approved and signed by kube-controller-manager), an
//! expired token gets nothing, and the scheduler judges a pod (unschedulable: no node yet).
//! The kubelet runs on this host only until its TLS bootstrap is done: its runtime socket never
//! answers, so it runs nothing, and it is stopped once it has its certificate, every file it
//! wrote under a temporary directory.

use crate::support;

use flexnode_test_tier::tier;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use support::Lab;

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn bootstrap_token(lab: &Lab, ttl: &str) -> std::path::PathBuf {
    let out = Command::new(support::script())
        .args(["bootstrap-token", "--ttl", ttl, "--dir"])
        .arg(&lab.dir)
        .output()
        .expect("run bootstrap-token");
    assert!(out.status.success(), "{}", text(&out));
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "bootstrap-token printed {path:?}");
    path
}

/// The token a `bootstrap-token` kubeconfig carries.
fn token_of(kubeconfig: &Path) -> String {
    let text = std::fs::read_to_string(kubeconfig).expect("bootstrap kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("a token line")
        .to_string()
}

/// The client certificate a kubelet bootstrapped in `pki`, checked: for `node`, in
/// `system:nodes`, signed by the lab's CA.
fn assert_node_certificate(lab: &Lab, pki: &Path, node: &str) {
    let cert = pki.join("kubelet-client-current.pem");
    let subject = openssl(&["x509", "-noout", "-subject", "-in"], &cert);
    assert!(
        subject.contains("O = system:nodes")
            && subject.contains(&format!("CN = system:node:{node}")),
        "{subject}"
    );
    let ca = lab.dir.join("pki/ca.crt").display().to_string();
    let verified = openssl(&["verify", "-CAfile", &ca], &cert);
    assert!(verified.trim().ends_with(": OK"), "{verified}");
}

/// Runs the lab's kubelet with `args` until it has bootstrapped its client certificate and
/// written the kubeconfig its `--kubeconfig` names (the certificate comes first, the
/// kubeconfig a moment after), then stops it; returns its certificate directory. Its state goes under `root`, and its runtime
/// is a socket there that accepts and never answers: the kubelet waits on it (whether it
/// bootstraps first or, with certificate rotation, in the background) instead of running
/// anything on this host.
fn bootstrapped(lab: &Lab, root: &Path, args: &[String]) -> std::path::PathBuf {
    let _runtime =
        std::os::unix::net::UnixListener::bind(root.join("no-runtime.sock")).expect("runtime");
    let pki = root.join("var/lib/kubelet/pki");
    let mut kubelet = Stopped(
        Command::new(lab.bin().join("kubelet"))
            .args(args)
            .arg(format!("--cert-dir={}", pki.display()))
            .arg(format!("--root-dir={}/var/lib/kubelet", root.display()))
            .current_dir(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run kubelet"),
    );
    let cert = pki.join("kubelet-client-current.pem");
    let kubeconfig = args
        .iter()
        .find_map(|a| a.strip_prefix("--kubeconfig="))
        .map(|p| root.join(p))
        .expect("a --kubeconfig argument");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(cert.exists() && kubeconfig.exists()) {
        if let Some(status) = kubelet.0.try_wait().expect("wait") {
            panic!("the kubelet exited ({status}) before its TLS bootstrap");
        }
        assert!(
            Instant::now() < deadline,
            "no client certificate and kubeconfig after 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(kubelet);
    pki
}

fn openssl(args: &[&str], file: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .arg(file)
        .output()
        .expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tier(controlplane)]
#[test]
fn a_kubelet_bootstraps_its_client_certificate_with_a_bootstrap_token() {
    let lab = Lab::up_with_controllers();
    let kubelet = lab.bin().join("kubelet");
    let version = Command::new(&kubelet)
        .arg("--version")
        .output()
        .expect("kubelet --version");
    assert_eq!(text(&version).trim(), "Kubernetes v1.34.12");

    let bootstrap = bootstrap_token(&lab, "3600");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&bootstrap).expect("stat").permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o600,
        "the bootstrap kubeconfig holds a token"
    );

    let work = tempfile::tempdir().expect("tmp");
    let w = work.path();
    std::fs::write(
        w.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             authentication: {{anonymous: {{enabled: false}}, webhook: {{enabled: true}}}}\n\
             authorization: {{mode: Webhook}}\nfailSwapOn: false\n\
             containerRuntimeEndpoint: unix://{}/no-runtime.sock\n",
            w.display()
        ),
    )
    .expect("kubelet config");
    let pki = bootstrapped(
        &lab,
        w,
        &[
            format!("--config={}/config.yaml", w.display()),
            format!("--bootstrap-kubeconfig={}", bootstrap.display()),
            format!("--kubeconfig={}/kubelet.kubeconfig", w.display()),
            "--hostname-override=bootstrap-test-1".to_string(),
        ],
    );
    assert_node_certificate(&lab, &pki, "bootstrap-test-1");
    let (ok, csrs) = lab.kubectl(&[
        "get",
        "csr",
        "-o",
        "jsonpath={range .items[*]}{.spec.username} {.spec.signerName} {.status.conditions[*].type}{\"\\n\"}{end}",
    ]);
    assert!(ok, "{csrs}");
    let id = bootstrap
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("bootstrap-"))
        .expect("bootstrap-ID.kubeconfig");
    assert!(
        csrs.lines().any(|l| l
            == format!(
                "system:bootstrap:{id} kubernetes.io/kube-apiserver-client-kubelet Approved"
            )),
        "{csrs}"
    );
    let kubeconfig = std::fs::read_to_string(w.join("kubelet.kubeconfig")).expect("kubeconfig");
    assert!(
        kubeconfig.contains("kubelet-client-current.pem"),
        "{kubeconfig}"
    );
}

#[tier(controlplane)]
#[test]
fn an_expired_bootstrap_token_is_refused() {
    let lab = Lab::up_with_controllers();
    let expired = bootstrap_token(&lab, "0");
    let kubectl = lab.bin().join("kubectl");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&expired)
            .args(["auth", "whoami"])
            .output()
            .expect("kubectl auth whoami");
        if !out.status.success() {
            assert!(text(&out).contains("Unauthorized"), "{}", text(&out));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an expired token still authenticates"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tier(controlplane)]
#[test]
fn the_scheduler_marks_a_pod_unschedulable_while_no_node_exists() {
    let lab = Lab::up_with_controllers();
    let deadline = Instant::now() + Duration::from_secs(60);
    // A fresh cluster: the namespace's default service account comes a moment after.
    loop {
        let (ok, out) = lab.kubectl(&[
            "run",
            "waits-for-a-node",
            "--image=flexnode.invalid/none:0",
            "--restart=Never",
        ]);
        if ok {
            break;
        }
        assert!(
            out.contains("serviceaccount \"default\" not found") && Instant::now() < deadline,
            "{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // No node yet: the scheduler's own verdict is the proof it runs.
    loop {
        let (_, reason) = lab.kubectl(&[
            "get",
            "pod",
            "waits-for-a-node",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ]);
        if reason.trim() == "Unschedulable" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not seen by the scheduler: {reason:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The files the agent writes into a machine (`files_from` the agent's kubeconfig's cluster
/// and a token file) are what the real kubelet bootstraps with. The kubelet runs on this host, so the
/// machine's absolute paths are moved under a temporary root (`bootstrapped` gives it a
/// runtime socket that never answers).
#[tier(controlplane)]
#[test]
fn the_machine_files_bootstrap_the_real_kubelet() {
    use flexnode::effects::host::kubelet::files_from;
    use flexnode::effects::host::{KUBELET_ENV, KubeletInputs};
    let lab = Lab::up_with_controllers();
    let token = token_of(&bootstrap_token(&lab, "3600"));
    let work = tempfile::tempdir().expect("tmp");
    let token_file = work.path().join("bootstrap-token");
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let (server, ca_pem) =
        flexnode::config::kubeconfig_cluster(&lab.dir.join("admin.kubeconfig")).expect("cluster");
    let files = files_from(
        &KubeletInputs {
            node_name: "machine-files-1".into(),
            server,
            ca_pem,
            credential: flexnode::effects::host::KubeletSource::BootstrapTokenFile(token_file),
            trusted_ca_file: None,
            registry_credentials_file: None,
            // Pinned, as every image the node pulls; nothing pulls it here (no runtime).
            sandbox_image: format!("flexnode.invalid/pause:lab@sha256:{}", "0".repeat(64)),
            sandbox_image_archive: None,
            pod_cidr: "10.88.0.0/16".into(),
            tuning: Default::default(),
        },
        &Default::default(),
    )
    .expect("files");
    let root = &work.path().join("machine");
    let moved = |text: &str| {
        text.replace(
            "/etc/kubernetes/",
            &format!("{}/etc/kubernetes/", root.display()),
        )
        .replace(
            "/var/lib/kubelet/",
            &format!("{}/var/lib/kubelet/", root.display()),
        )
        .replace(
            "unix:///run/containerd/containerd.sock",
            &format!("unix://{}/no-runtime.sock", root.display()),
        )
    };
    for f in &files {
        let path = root.join(&f.path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(&path, moved(&String::from_utf8_lossy(&f.contents))).expect("write");
    }
    let env = std::fs::read_to_string(root.join(KUBELET_ENV)).expect("env");
    let args: Vec<String> = env
        .lines()
        .find_map(|l| l.strip_prefix("KUBELET_ARGS="))
        .expect("KUBELET_ARGS")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let pki = bootstrapped(&lab, root, &args);
    assert_node_certificate(&lab, &pki, "machine-files-1");
}

/// A child process killed (and reaped) when dropped, also when the test fails.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
