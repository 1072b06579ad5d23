//! What a machine's kubelet and containerd are given, as files of the machine's tree: the
//! cluster's address and CA, the node's name, its first credential (a bootstrap token: the
//! kubelet turns it into a client certificate, which it then renews itself), containerd's CRI
//! settings and a bridge CNI network. Settings the kubelet in an nspawn machine needs (from
//! running one in the lab, docs/node.md): the systemd cgroup driver in both the kubelet and
//! containerd, Debian's CNI plugins in /usr/lib/cni, webhook authentication and authorization
//! with the cluster CA as the client CA. JSON for the kubelet's files (its YAML parser reads it,
//! and serde escapes every value); containerd's TOML holds only validated values.

use super::kubelet_plugin::{KUBELET_EXEC_KUBECONFIG, KubeletPlugin, kubelet_kubeconfig};
use super::sandbox_archive::sandbox_archive_files;
use crate::effects::containerd::basic_credentials;
use crate::effects::fs::read_small;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::kubelet::{
    DEFAULT_CLUSTER_DOMAIN, KubeletTuning, check_node_settings, taint_parts,
};
use crate::lifecycle::state::NodeSettings;
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
    /// The agent's `flexnode token`, run by the kubelet (src/effects/host/kubelet_plugin.rs).
    Exec(&'a KubeletPlugin),
}

/// Where the kubelet's credential comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeletSource {
    BootstrapTokenFile(PathBuf),
    Exec(KubeletPlugin),
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
    /// The Machine's labels and taints for the Node.
    pub node: &'a NodeSettings,
    /// The configuration's kubelet settings (its `nodeIP` is `node_ip` here).
    pub tuning: &'a KubeletTuning,
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
    pub credential: KubeletSource,
    pub trusted_ca_file: Option<PathBuf>,
    pub registry_credentials_file: Option<PathBuf>,
    pub sandbox_image: String,
    /// An offline node's OCI archive of the sandbox image (`sandbox_archive.rs`).
    pub sandbox_image_archive: Option<PathBuf>,
    pub pod_cidr: String,
    pub tuning: KubeletTuning,
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
    /// The Machine's labels or taints (the message names the field).
    #[error("{0}")]
    NodeSettings(String),
    #[error("{0}: {1}")]
    Tuning(String, String),
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
    if let KubeletCredential::BootstrapToken(token) = s.credential
        && !valid_bootstrap_token(token)
    {
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
    check_node_settings(s.node).map_err(KubeletSettingsError::NodeSettings)?;
    s.tuning
        .check()
        .map_err(|(key, why)| KubeletSettingsError::Tuning(key, why))?;
    Ok(())
}

/// The machine's files for `s`, in the order they are written (the kubelet's arguments last:
/// the unit is conditioned on them).
pub fn machine_files(s: &KubeletSettings) -> Result<Vec<MachineFile>, KubeletSettingsError> {
    validate(s)?;
    let from_cluster = s.pod_cidr == POD_RANGE_FROM_CLUSTER;
    use base64::Engine;
    let ca_data = base64::engine::general_purpose::STANDARD.encode(s.ca_pem);
    // The kubeconfig the kubelet starts from, and its arguments for it.
    let (kubeconfig, kubeconfig_args) = match s.credential {
        KubeletCredential::BootstrapToken(token) => (
            (
                "etc/kubernetes/bootstrap.kubeconfig",
                serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "cluster", "cluster": {
                        "server": s.server, "certificate-authority-data": ca_data}}],
                    "users": [{"name": "kubelet-bootstrap", "user": {"token": token}}],
                    "contexts": [{"name": "bootstrap", "context": {
                        "cluster": "cluster", "user": "kubelet-bootstrap"}}],
                    "current-context": "bootstrap",
                }),
            ),
            [
                "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap.kubeconfig",
                "--kubeconfig=/var/lib/kubelet/kubeconfig",
            ]
            .join(" "),
        ),
        KubeletCredential::Exec(plugin) => (
            (
                KUBELET_EXEC_KUBECONFIG,
                kubelet_kubeconfig(s.server, &ca_data, plugin),
            ),
            format!("--kubeconfig=/{KUBELET_EXEC_KUBECONFIG}"),
        ),
    };
    // A client certificate to rotate only when the kubelet made one from the token.
    let rotate = matches!(s.credential, KubeletCredential::BootstrapToken(_));
    let config = kubelet_configuration(s, rotate);
    let args = ["--config=/etc/kubernetes/kubelet.yaml", &kubeconfig_args];
    // The node name is a DNS-1123 subdomain (config validation) and labels are checked
    // (`check_node_settings`): no quoting needed. Labels have no field in the configuration.
    let node_ip = s
        .node_ip
        .map(|ip| format!(" --node-ip={ip}"))
        .unwrap_or_default();
    let labels = if s.node.labels.is_empty() {
        String::new()
    } else {
        let pairs: Vec<String> = s
            .node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(" --node-labels={}", pairs.join(","))
    };
    let env = format!(
        "# flexnode: the kubelet's arguments.\nKUBELET_ARGS={} --hostname-override={}{node_ip}{labels}\n",
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
        file(kubeconfig.0, json(&kubeconfig.1), 0o600),
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

/// The kubelet's `KubeletConfiguration`: what it needs in a machine, the configuration's
/// settings, the Machine's taints.
fn kubelet_configuration(s: &KubeletSettings, rotate: bool) -> serde_json::Value {
    let t = s.tuning;
    let mut config = serde_json::json!({
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
        "rotateCertificates": rotate,
        "clusterDomain": t.cluster_domain.as_deref().unwrap_or(DEFAULT_CLUSTER_DOMAIN),
    });
    let mut set = |key: &str, value: serde_json::Value| {
        if let Some(map) = config.as_object_mut() {
            map.insert(key.to_string(), value);
        }
    };
    if let Some(n) = t.max_pods {
        set("maxPods", n.into());
    }
    for (key, map) in [
        ("systemReserved", &t.system_reserved),
        ("kubeReserved", &t.kube_reserved),
        ("evictionHard", &t.eviction_hard),
    ] {
        if !map.is_empty() {
            set(key, serde_json::json!(map));
        }
    }
    if let Some(p) = t.image_gc_high_threshold_percent {
        set("imageGCHighThresholdPercent", p.into());
    }
    if let Some(p) = t.image_gc_low_threshold_percent {
        set("imageGCLowThresholdPercent", p.into());
    }
    if !t.cluster_dns.is_empty() {
        let ips: Vec<String> = t.cluster_dns.iter().map(ToString::to_string).collect();
        set("clusterDNS", serde_json::json!(ips));
    }
    let taints: Vec<serde_json::Value> = s
        .node
        .taints
        .iter()
        .filter_map(|taint| taint_parts(taint))
        .map(|(key, value, effect)| {
            let mut t = serde_json::json!({"key": key, "effect": effect});
            if !value.is_empty() {
                t["value"] = value.into();
            }
            t
        })
        .collect();
    if !taints.is_empty() {
        set("registerWithTaints", taints.into());
    }
    config
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
pub fn files_from(inputs: &KubeletInputs, node: &NodeSettings) -> EffectResult<Vec<MachineFile>> {
    let read = |path: &Path| -> EffectResult<String> {
        read_small(path, 1 << 20, true)?
            .ok_or_else(|| EffectError::Failed(format!("{}: not found", path.display())))
    };
    let bad = |path: &Path, why: &str| EffectError::Failed(format!("{}: {why}", path.display()));
    let token;
    let (credential, plugin_files) = match &inputs.credential {
        KubeletSource::BootstrapTokenFile(path) => {
            token = read(path)?;
            (KubeletCredential::BootstrapToken(token.trim()), Vec::new())
        }
        KubeletSource::Exec(plugin) => (KubeletCredential::Exec(plugin), plugin_files(plugin)?),
    };
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
        credential,
        sandbox_image: &inputs.sandbox_image,
        pod_cidr: &inputs.pod_cidr,
        node_ip: inputs
            .tuning
            .node_ip
            .or_else(|| address_towards(&inputs.server)),
        node,
        tuning: &inputs.tuning,
        registries,
        registry_ca_pem: registry_ca.as_deref(),
        // The machine is started by the host's init, so its bounding set is the machine's. In
        // the container install /proc/1 is the agent's own container, whose set lacks it: the
        // restriction is then on, and harmless where the machine's containerd runs at -999 as
        // its unit sets (every pod's score is above that).
        restrict_oom_score_adj: std::fs::read_to_string("/proc/1/status")
            .is_ok_and(|status| !can_lower_oom_scores(&status)),
    };
    let mut files = machine_files(&settings)
        .map_err(|e| EffectError::Failed(format!("kubelet settings: {e}")))?;
    let sandbox_files = match &inputs.sandbox_image_archive {
        Some(archive) => sandbox_archive_files(archive, &inputs.sandbox_image)?
            .into_iter()
            .map(|(path, contents)| MachineFile {
                path: PathBuf::from(path),
                contents,
                mode: 0o644,
            })
            .collect(),
        None => Vec::new(),
    };
    // Before the kubelet's arguments, which the unit is conditioned on.
    let at = files.len().saturating_sub(1);
    files.splice(at..at, plugin_files.into_iter().chain(sandbox_files));
    Ok(files)
}

/// The plugin's files, read from the host: the agent's binary whole, the others small.
fn plugin_files(plugin: &KubeletPlugin) -> EffectResult<Vec<MachineFile>> {
    let mut files = Vec::new();
    for (from, to, mode) in plugin.files() {
        let contents = if to == Path::new(super::kubelet_plugin::PLUGIN_BINARY) {
            std::fs::read(&from).map_err(|e| crate::effects::fs::io_failed("read", &from, &e))?
        } else {
            read_small(&from, 1 << 20, true)?
                .ok_or_else(|| {
                    EffectError::Failed(format!(
                        "{}: not found (the kubelet's credential plugin reads it)",
                        from.display()
                    ))
                })?
                .into_bytes()
        };
        files.push(MachineFile {
            path: to,
            contents,
            mode,
        });
    }
    Ok(files)
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
#[path = "kubelet_tests.rs"]
mod tests;
