//! What a machine's kubelet and containerd are given, as files of the machine's tree: the
//! cluster's address and CA, the node's name, its first credential (a bootstrap token: the
//! kubelet turns it into a client certificate, which it then renews itself), containerd's CRI
//! settings and a bridge CNI network. Settings the kubelet in an nspawn machine needs (from
//! running one in the lab, docs/node.md): the systemd cgroup driver in both the kubelet and
//! containerd, Debian's CNI plugins in /usr/lib/cni, webhook authentication and authorization
//! with the cluster CA as the client CA. JSON for the kubelet's files (its YAML parser reads it,
//! and serde escapes every value); containerd's TOML holds only validated values.

use crate::effects::containerd::basic_credentials;
use crate::effects::fs::read_small;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::validate::{
    POD_RANGE_FROM_CLUSTER, parse_pinned_image, valid_bootstrap_token, valid_pod_range,
};
use std::path::{Path, PathBuf};

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
    /// The pod sandbox image, pinned by digest (`parse_pinned_image`: no quote or newline).
    pub sandbox_image: &'a str,
    /// The bridge network's pod range, e.g. `10.88.0.0/16`, or [`POD_RANGE_FROM_CLUSTER`].
    pub pod_cidr: &'a str,
    /// The node's address (`--node-ip`); `None`: the kubelet finds one (or reports none).
    pub node_ip: Option<std::net::IpAddr>,
    /// Registries the machine's containerd pulls from (the sandbox image's among them), with
    /// the credentials the agent's registry file has for them.
    pub registries: Vec<RegistryAccess>,
    /// Certificates the machine's containerd trusts for those registries, PEM.
    pub registry_ca_pem: Option<&'a [u8]>,
    /// The host cannot lower a process's OOM score (its init lacks `CAP_SYS_RESOURCE`, as a
    /// node that is itself a container may): containerd then keeps pods' scores at or above
    /// its own, since runc fails to start any pod sandbox whose -998 it cannot set.
    pub restrict_oom_score_adj: bool,
}

/// A registry host and its `user:password`, base64, if it needs one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryAccess {
    pub host: String,
    pub auth: Option<String>,
}

/// Where the kubelet's settings come from: the node's configuration as this process reaches
/// its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletInputs {
    pub node_name: String,
    /// The API server as the agent reaches it (its kubeconfig's), `https://…`.
    pub server: String,
    /// The cluster CA, PEM (from the agent's kubeconfig).
    pub ca_pem: Vec<u8>,
    pub bootstrap_token_file: PathBuf,
    pub trusted_ca_file: Option<PathBuf>,
    pub registry_credentials_file: Option<PathBuf>,
    pub sandbox_image: String,
    pub pod_cidr: String,
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
    #[error("the sandbox image {0:?} is not an image pinned by digest")]
    SandboxImage(String),
    #[error("the pod range {0:?} is not an IPv4 CIDR")]
    PodCidr(String),
    #[error("the API server address is not an https URL")]
    Server,
    #[error("the registry host {0:?} is not a host[:port]")]
    Registry(String),
}

fn file(path: &str, contents: String, mode: u32) -> MachineFile {
    MachineFile {
        path: PathBuf::from(path),
        contents: contents.into_bytes(),
        mode,
    }
}

/// Every value of `s` that a file quotes, checked (never quoting a credential back).
fn validate(s: &KubeletSettings) -> Result<(), KubeletSettingsError> {
    let KubeletCredential::BootstrapToken(token) = s.credential;
    if !valid_bootstrap_token(token) {
        return Err(KubeletSettingsError::BootstrapToken);
    }
    if parse_pinned_image(s.sandbox_image).is_err() {
        return Err(KubeletSettingsError::SandboxImage(s.sandbox_image.into()));
    }
    if !valid_pod_range(s.pod_cidr) {
        return Err(KubeletSettingsError::PodCidr(s.pod_cidr.into()));
    }
    if !s.server.starts_with("https://") || s.server.contains(char::is_whitespace) {
        return Err(KubeletSettingsError::Server);
    }
    for r in &s.registries {
        let host_ok = !r.host.is_empty()
            && r.host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".:-[]".contains(&b));
        let auth_ok = r.auth.as_ref().is_none_or(|a| {
            a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        });
        if !host_ok || !auth_ok {
            return Err(KubeletSettingsError::Registry(r.host.clone()));
        }
    }
    Ok(())
}

/// The machine's files for `s`, in the order they are written (the kubelet's arguments last:
/// the unit is conditioned on them).
pub fn machine_files(s: &KubeletSettings) -> Result<Vec<MachineFile>, KubeletSettingsError> {
    validate(s)?;
    let KubeletCredential::BootstrapToken(token) = s.credential;
    let from_cluster = s.pod_cidr == POD_RANGE_FROM_CLUSTER;
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
    let node_ip = s
        .node_ip
        .map(|ip| format!(" --node-ip={ip}"))
        .unwrap_or_default();
    let env = format!(
        "# flexnode: the kubelet's arguments.\nKUBELET_ARGS={} --hostname-override={}{node_ip}\n",
        args.join(" "),
        s.node_name
    );
    let containerd = containerd_toml(s, from_cluster);
    // A password in it makes it private.
    let containerd_mode = if s.registries.iter().any(|r| r.auth.is_some()) {
        0o600
    } else {
        0o644
    };
    let cni = bridge_network(s, from_cluster);
    let json = |v: &serde_json::Value| v.to_string() + "\n";
    let mut files = Vec::new();
    if let Some(pem) = s.registry_ca_pem {
        files.push(file(
            REGISTRY_CA,
            String::from_utf8_lossy(pem).into_owned(),
            0o644,
        ));
    }
    files.extend([
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
        file("etc/containerd/config.toml", containerd, containerd_mode),
        if from_cluster {
            file(CNI_TEMPLATE, json(&cni), 0o644)
        } else {
            file("etc/cni/net.d/10-flexnode.conflist", json(&cni), 0o644)
        },
    ]);
    if from_cluster {
        files.extend(pod_bridge_reset());
    }
    files.push(file(KUBELET_ENV, env, 0o644));
    Ok(files)
}

/// containerd's CRI settings: the sandbox image, the OOM-score restriction, systemd cgroups,
/// the bridge network (or its template), the registries' credentials and CA.
fn containerd_toml(s: &KubeletSettings, from_cluster: bool) -> String {
    let mut toml = format!(
        "# flexnode: containerd's CRI for the kubelet.\nversion = 2\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{}\"\n  \
         restrict_oom_score_adj = {}\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  \
         runtime_type = \"io.containerd.runc.v2\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  \
         SystemdCgroup = true\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n  \
         conf_dir = \"/etc/cni/net.d\"\n{}",
        s.sandbox_image,
        s.restrict_oom_score_adj,
        if from_cluster {
            format!("  conf_template = \"/{CNI_TEMPLATE}\"\n")
        } else {
            String::new()
        }
    );
    // containerd 1.6's CRI registry settings (the node image's containerd).
    for r in &s.registries {
        let table = format!(
            "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"{}\"",
            r.host
        );
        if let Some(auth) = &r.auth {
            toml += &format!("{table}.auth]\n  auth = \"{auth}\"\n");
        }
        if s.registry_ca_pem.is_some() {
            toml += &format!("{table}.tls]\n  ca_file = \"/{REGISTRY_CA}\"\n");
        }
    }
    toml
}

/// The machine's bridge network, with its range (or the template's placeholder for it).
/// `hairpinMode`: a pod that reaches a Service whose endpoint is itself gets its packet back
/// out of the port it came in by; without it that connection hangs (the native suite's
/// `service-clusterip-from-every-node`, e2e/native/suite.py).
fn bridge_network(s: &KubeletSettings, from_cluster: bool) -> serde_json::Value {
    // containerd's template language (Go's text/template) names the node's range.
    let subnet = if from_cluster {
        "{{.PodCIDR}}"
    } else {
        s.pod_cidr
    };
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "flexnode",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
             "hairpinMode": true,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
}

/// Both sides share the host's network namespace, so the pod bridge the other side left
/// there keeps its gateway address: after a repave whose Node took a new range, every
/// sandbox of the new side failed ("failed to set bridge addr: \"cni0\" already has an IP
/// address different from …"). At each boot of the machine, before its containerd, the
/// bridge is removed (none of this machine's pods exist yet; a containerd restart does not
/// run it again). The failure of an image without `ip` is ignored.
fn pod_bridge_reset() -> [MachineFile; 2] {
    [
        file(
            "etc/systemd/system/flexnode-pod-bridge-reset.service",
            "# flexnode: the pod bridge of the machine's last boot (or the other side's) removed.\n\
             [Unit]\nDescription=The pod bridge removed before containerd starts (flexnode)\n\
             Before=containerd.service\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n\
             ExecStart=-ip link delete cni0\n"
                .to_string(),
            0o644,
        ),
        file(
            "etc/systemd/system/containerd.service.d/flexnode-pod-bridge.conf",
            "# flexnode: see flexnode-pod-bridge-reset.service.\n\
             [Unit]\nWants=flexnode-pod-bridge-reset.service\n\
             After=flexnode-pod-bridge-reset.service\n"
                .to_string(),
            0o644,
        ),
    ]
}

/// The bridge network's template, when the pod range comes from the cluster.
const CNI_TEMPLATE: &str = "etc/containerd/flexnode-cni.template";

/// The registry CA's place in the machine's tree.
const REGISTRY_CA: &str = "etc/containerd/flexnode-registry-ca.pem";

/// The machine's files from `inputs`: the token from its file, the registries' credentials
/// from the agent's. Errors name files, never their contents.
pub fn files_from(inputs: &KubeletInputs) -> EffectResult<Vec<MachineFile>> {
    let read = |path: &Path| -> EffectResult<String> {
        read_small(path, 1 << 20, true)?
            .ok_or_else(|| EffectError::Failed(format!("{}: not found", path.display())))
    };
    let bad = |path: &Path, why: &str| EffectError::Failed(format!("{}: {why}", path.display()));
    let token = read(&inputs.bootstrap_token_file)?;
    let registry_ca = inputs
        .trusted_ca_file
        .as_deref()
        .map(|p| read(p).map(String::into_bytes))
        .transpose()?;
    let credentials = inputs
        .registry_credentials_file
        .as_deref()
        .map(read)
        .transpose()?;
    let mut hosts: Vec<String> = credentials
        .as_deref()
        .and_then(|doc| serde_json::from_str::<serde_json::Value>(doc).ok())
        .and_then(|v| {
            v.get("auths")?
                .as_object()
                .map(|a| a.keys().cloned().collect())
        })
        .unwrap_or_default();
    if let Some(host) = image_host(&inputs.sandbox_image)
        && !hosts.iter().any(|h| h == host)
    {
        hosts.push(host.to_string());
    }
    let mut registries = Vec::new();
    for host in hosts {
        let auth = match &credentials {
            None => None,
            Some(doc) => basic_credentials(doc, &host)
                .map_err(|why| {
                    bad(
                        inputs
                            .registry_credentials_file
                            .as_deref()
                            .unwrap_or(Path::new("registry credentials")),
                        why,
                    )
                })?
                .map(|(user, pass)| {
                    use base64::Engine;
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
                }),
        };
        registries.push(RegistryAccess { host, auth });
    }
    let settings = KubeletSettings {
        node_name: &inputs.node_name,
        server: &inputs.server,
        ca_pem: &inputs.ca_pem,
        credential: KubeletCredential::BootstrapToken(token.trim()),
        sandbox_image: &inputs.sandbox_image,
        pod_cidr: &inputs.pod_cidr,
        node_ip: address_towards(&inputs.server),
        registries,
        registry_ca_pem: registry_ca.as_deref(),
        // The machine is started by the host's init, so its bounding set is the machine's. In
        // the container install /proc/1 is the agent's own container, whose set lacks it: the
        // restriction is then on, and harmless where the machine's containerd runs at -999 as
        // its unit sets (every pod's score is above that).
        restrict_oom_score_adj: std::fs::read_to_string("/proc/1/status")
            .is_ok_and(|status| !can_lower_oom_scores(&status)),
    };
    machine_files(&settings).map_err(|e| EffectError::Failed(format!("kubelet settings: {e}")))
}

/// Whether a process whose `/proc/PID/status` is `status` may lower OOM scores: its bounding
/// set holds `CAP_SYS_RESOURCE`. A status without a readable `CapBnd` answers yes (what every
/// host the agent was built for does).
fn can_lower_oom_scores(status: &str) -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_none_or(|set| set & (1 << CAP_SYS_RESOURCE) != 0)
}

/// This host's address on the way to the API server at `server` (`https://host:port`): the
/// source address the kernel picks for it (a UDP socket's connect sends nothing). Without it
/// a kubelet in a machine whose host name does not resolve reported no address at all, and
/// the API server could not reach it for logs and exec.
fn address_towards(server: &str) -> Option<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let authority = server.strip_prefix("https://")?.split('/').next()?;
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:443")
    };
    let target = with_port.to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = std::net::UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified() && !ip.is_loopback()).then_some(ip)
}

/// The registry of a reference that names one (`host[:port]/…` with a dot, a colon or
/// `localhost` in its first part, as Docker reads references).
fn image_host(reference: &str) -> Option<&str> {
    let (first, _) = reference.split_once('/')?;
    (first.contains('.') || first.contains(':') || first == "localhost").then_some(first)
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
            sandbox_image: "10.0.2.100:5000/lab/pause@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a",
            pod_cidr: "10.88.0.0/16",
            node_ip: Some(std::net::IpAddr::from([10, 0, 2, 15])),
            registries: vec![RegistryAccess {
                host: "10.0.2.100:5000".into(),
                auth: Some("dXNlcjpwdw==".into()),
            }],
            registry_ca_pem: Some(
                b"-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n",
            ),
            restrict_oom_score_adj: false,
        }
    }

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
            bootstrap_token_file: token,
            trusted_ca_file: Some(ca),
            registry_credentials_file: Some(creds),
            sandbox_image: "registry.example/pause:3.10@sha256:ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a".into(),
            pod_cidr: "10.88.0.0/16".into(),
        };
        let files = files_from(&inputs).expect("files");
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
}
