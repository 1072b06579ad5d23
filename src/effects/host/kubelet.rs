//! What a machine's kubelet and containerd are given, as files of the machine's tree: the
//! cluster's address and CA, the node's name, its first credential (a bootstrap token: the
//! kubelet turns it into a client certificate, which it then renews itself), containerd's CRI
//! settings and a bridge CNI network. Settings the kubelet in an nspawn machine needs (from
//! running one in the lab, docs/node.md): the systemd cgroup driver in both the kubelet and
//! containerd, Debian's CNI plugins in /usr/lib/cni, webhook authentication and authorization
//! with the cluster CA as the client CA. JSON for the kubelet's files (its YAML parser reads it,
//! and serde escapes every value); containerd's TOML holds only validated values.

use std::path::PathBuf;

/// Where the node image's kubelet unit reads its arguments (`e2e/node-image/build`).
pub const KUBELET_ENV: &str = "etc/kubernetes/kubelet.env";

/// The kubelet's first credential.
pub enum KubeletCredential<'a> {
    /// `abcdef.0123456789abcdef`: what the bootstrap kubeconfig carries.
    BootstrapToken(&'a str),
}

pub struct KubeletSettings<'a> {
    pub node_name: &'a str,
    /// `https://…` as the agent reaches the API server.
    pub server: &'a str,
    /// The cluster CA, PEM.
    pub ca_pem: &'a [u8],
    pub credential: KubeletCredential<'a>,
    /// The pod sandbox image, a reference of `[A-Za-z0-9._/:@-]`.
    pub sandbox_image: &'a str,
    /// The bridge network's pod range, e.g. `10.88.0.0/16`.
    pub pod_cidr: &'a str,
}

/// A file of the machine's tree: its path relative to the tree, contents, mode.
#[derive(Debug, PartialEq, Eq)]
pub struct MachineFile {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    pub mode: u32,
}

/// Why settings cannot be written (never quoting a credential).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KubeletSettingsError {
    #[error("the bootstrap token is not of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}")]
    BootstrapToken,
    #[error("the sandbox image {0:?} is not an image reference")]
    SandboxImage(String),
    #[error("the pod range {0:?} is not an IPv4 CIDR")]
    PodCidr(String),
    #[error("the API server address is not an https URL")]
    Server,
}

fn valid_token(t: &str) -> bool {
    let lower = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    t.split_once('.')
        .is_some_and(|(id, secret)| lower(id, 6) && lower(secret, 16))
}

fn valid_reference(r: &str) -> bool {
    !r.is_empty()
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._/:@-".contains(&b))
}

fn valid_cidr(c: &str) -> bool {
    c.split_once('/').is_some_and(|(ip, bits)| {
        ip.parse::<std::net::Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
    })
}

fn file(path: &str, contents: String, mode: u32) -> MachineFile {
    MachineFile {
        path: PathBuf::from(path),
        contents: contents.into_bytes(),
        mode,
    }
}

/// The machine's files for `s`, in the order they are written (the kubelet's arguments last:
/// the unit is conditioned on them).
pub fn machine_files(s: &KubeletSettings) -> Result<Vec<MachineFile>, KubeletSettingsError> {
    let KubeletCredential::BootstrapToken(token) = s.credential;
    if !valid_token(token) {
        return Err(KubeletSettingsError::BootstrapToken);
    }
    if !valid_reference(s.sandbox_image) {
        return Err(KubeletSettingsError::SandboxImage(s.sandbox_image.into()));
    }
    if !valid_cidr(s.pod_cidr) {
        return Err(KubeletSettingsError::PodCidr(s.pod_cidr.into()));
    }
    if !s.server.starts_with("https://") || s.server.contains(char::is_whitespace) {
        return Err(KubeletSettingsError::Server);
    }
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(s.ca_pem);
    let bootstrap = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {
            "server": s.server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
        "contexts": [{"name": "bootstrap", "context": {
            "cluster": "cluster", "user": "kubelet-bootstrap"}}],
        "current-context": "bootstrap",
    });
    let config = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": "/etc/kubernetes/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "systemd",
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "rotateCertificates": true,
        "clusterDomain": "cluster.local",
    });
    let args = [
        "--config=/etc/kubernetes/kubelet.yaml",
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap.kubeconfig",
        "--kubeconfig=/var/lib/kubelet/kubeconfig",
    ];
    // The node name is a DNS-1123 subdomain (config validation): no quoting needed.
    let env = format!(
        "# flexnode: the kubelet's arguments.\nKUBELET_ARGS={} --hostname-override={}\n",
        args.join(" "),
        s.node_name
    );
    let containerd = format!(
        "# flexnode: containerd's CRI for the kubelet.\nversion = 2\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{}\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  \
         runtime_type = \"io.containerd.runc.v2\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  \
         SystemdCgroup = true\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  \
         conf_dir = \"/etc/cni/net.d\"\n",
        s.sandbox_image
    );
    let cni = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "flexnode",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": s.pod_cidr}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    let json = |v: &serde_json::Value| v.to_string() + "\n";
    Ok(vec![
        file(
            "etc/kubernetes/ca.crt",
            String::from_utf8_lossy(s.ca_pem).into_owned(),
            0o644,
        ),
        file(
            "etc/kubernetes/bootstrap.kubeconfig",
            json(&bootstrap),
            0o600,
        ),
        file("etc/kubernetes/kubelet.yaml", json(&config), 0o644),
        file("etc/containerd/config.toml", containerd, 0o644),
        file("etc/cni/net.d/10-flexnode.conflist", json(&cni), 0o644),
        file(KUBELET_ENV, env, 0o644),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(token: &str) -> KubeletSettings<'_> {
        KubeletSettings {
            node_name: "edge-07",
            server: "https://10.0.2.100:6443",
            ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
            credential: KubeletCredential::BootstrapToken(token),
            sandbox_image: "10.0.2.100:5000/lab/pause@sha256:00",
            pod_cidr: "10.88.0.0/16",
        }
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
}
