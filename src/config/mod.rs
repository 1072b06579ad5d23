//! The node's configuration (`flexnode join --config FILE`, `/etc/flexnode/config.yaml`).
//! Schema and the list of impossible settings: docs/config.md. An impossible setting is a
//! `ConfigError` naming it; the CLI exits 78 for those, and the bootstrap unit never retries.

mod drain;
mod files;
mod image;
pub mod kubeconfig;
mod node;

use crate::lifecycle::agent::InstallMode;
use crate::lifecycle::fault::{Fault, FaultKind};
pub use crate::lifecycle::kubelet::KubeletTuning;
pub use crate::lifecycle::validate::{is_dns_subdomain, is_kubernetes_version};
use files::{
    check_bootstrap_token, check_ca, check_kubeconfig, check_registry_credentials, read_small,
};
pub use files::{kubeconfig_cluster, process_uid};
pub use image::{AgentImage, NodeImage, NodeImagePattern, NodeImages, VERSION_PLACEHOLDER};
use image::{ONLY_CONTAINER, agent_image};
use node::{NodeKeys, node_config};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where `join` installs the rendered configuration and the node's credential.
pub const CONFIG_PATH: &str = "/etc/flexnode/config.yaml";
pub const KUBECONFIG_PATH: &str = "/etc/flexnode/kubeconfig";
pub const TRUSTED_CA_PATH: &str = "/etc/flexnode/trusted-ca.pem";
pub const REGISTRY_CREDENTIALS_PATH: &str = "/etc/flexnode/registry-credentials.json";
pub const BOOTSTRAP_TOKEN_PATH: &str = "/etc/flexnode/bootstrap-token";
/// The pod sandbox image when the configuration names none (Kubernetes 1.34's), pinned by
/// its index digest like every image the node pulls.
pub const DEFAULT_SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10@sha256:\
     ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a";
pub const DEFAULT_POD_CIDR: &str = "10.88.0.0/16";
/// Config files are refused above this size (they are a few hundred bytes).
const MAX_FILE: u64 = 1 << 20;

/// The file as written by an operator. Unknown keys are refused (a typo must not pass
/// silently as a default).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Joining with a bootstrap token instead of a kubeconfig: the API server's URL …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<String>,
    /// … and its CA (PEM).
    #[serde(
        default,
        rename = "apiServerCAFile",
        skip_serializing_if = "Option::is_none"
    )]
    pub api_server_ca_file: Option<PathBuf>,
    /// The lifetime the agent asks for its certificate (`expirationSeconds`, ≥ 600); the
    /// signer's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_certificate_expiration_seconds: Option<i32>,
    /// Where in its life the agent's certificate is renewed: `[FROM, TO]` percent (a point
    /// drawn between); default `[70, 90]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_certificate_renew_at_percent: Option<[u8; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_mode: Option<String>,
    #[serde(
        default,
        rename = "trustedCAFile",
        skip_serializing_if = "Option::is_none"
    )]
    pub trusted_ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_credentials_file: Option<PathBuf>,
    /// The container install's image: `oci://REGISTRY/REPOSITORY[:TAG]`, pinned by
    /// `agentImageDigest` (as an AgentUpgrade names one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image_digest: Option<String>,
    /// The container install's image as an OCI archive on the node's disk (`image/build
    /// --archive`), imported by the bootstrap unit before it tries the registry: an offline
    /// install or re-join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image_archive: Option<PathBuf>,
    /// The node image per Kubernetes version, `oci://REGISTRY/REPOSITORY[:TAG]@sha256:…`:
    /// the machines run its kubelet; pins that win over `nodeImage`. Without either a machine
    /// is a minimal tree with no kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_images: Option<BTreeMap<String, String>>,
    /// The node image of any version: `oci://REGISTRY/REPOSITORY:TAG` with
    /// `{kubernetesVersion}` in the tag, resolved to a digest when a machine is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image: Option<String>,
    /// An offline node's node images: the path of an OCI archive (a tar of an OCI layout, or
    /// the layout's directory), `{kubernetesVersion}` naming the version. A version's archive,
    /// where it exists, is read instead of the registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_image_archive: Option<String>,
    /// An offline node's pod sandbox image: an OCI archive holding `sandboxImage`, imported
    /// into each machine's containerd before its kubelet starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_image_archive: Option<PathBuf>,
    /// The kubelet's settings (its `KubeletConfiguration`'s names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletTuning>,
    /// A private file holding a bootstrap token (`abcdef.0123456789abcdef`): the kubelet's
    /// first credential, and the agent's when it joins with `apiServer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_image: Option<String>,
    #[serde(default, rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// Where the daemon serves Prometheus metrics (`127.0.0.1:9464`); loopback only, off
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_address: Option<String>,
    /// The drain before a disruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<drain::DrainFile>,
}

/// A validated configuration: every field usable as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub node_name: String,
    /// The agent's credential; with `token_join`, where `join` writes the one it obtains.
    pub kubeconfig: PathBuf,
    /// Joining with a bootstrap token: the agent obtains its certificate by a CSR.
    pub token_join: Option<TokenJoin>,
    /// The bootstrap token (the kubelet's, and the agent's with `token_join`).
    pub bootstrap_token_file: Option<PathBuf>,
    /// `expirationSeconds` of the agent's certificate requests.
    pub agent_certificate_expiration_seconds: Option<i32>,
    pub renew_at: RenewAt,
    pub kubernetes_version: String,
    pub install_mode: InstallMode,
    /// Certificates trusted for https downloads and registries beyond the system store.
    pub trusted_ca_file: Option<PathBuf>,
    /// Registry credentials (Docker `config.json` shape), private to root.
    pub registry_credentials_file: Option<PathBuf>,
    /// The container install's image; `None` on the host install.
    pub agent_image: Option<AgentImage>,
    /// What the machines' kubelet runs from; `None`: machines without a kubelet.
    pub node: Option<NodeConfig>,
    /// Where the daemon serves metrics; `None`: not served.
    pub metrics_address: Option<std::net::SocketAddr>,
    pub drain: crate::lifecycle::drain::DrainPolicy,
}

/// Where a node that joins with a bootstrap token asks for its certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenJoin {
    /// `https://…`.
    pub server: String,
    pub ca_file: PathBuf,
}

/// When in a certificate's life it is renewed: a point drawn between the two percents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewAt {
    pub from_percent: u8,
    pub to_percent: u8,
}

impl Default for RenewAt {
    fn default() -> Self {
        Self {
            from_percent: 70,
            to_percent: 90,
        }
    }
}

impl RenewAt {
    /// The Unix second a certificate valid from `not_before` to `not_after` is renewed at;
    /// `draw` in [0, 1) places it between the percents (nodes that joined together do not
    /// all renew together).
    pub fn point(self, not_before: i64, not_after: i64, draw: f64) -> i64 {
        let life = (not_after - not_before) as f64;
        let (from, to) = (f64::from(self.from_percent), f64::from(self.to_percent));
        let percent = from + (to - from) * draw.clamp(0.0, 1.0);
        not_before + (life * percent / 100.0) as i64
    }
}

/// The lowest `expirationSeconds` the API server takes.
pub const MIN_CERTIFICATE_SECONDS: i32 = 600;

/// The kubelet's side of the configuration (its bootstrap token is `Config`'s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub images: NodeImages,
    pub sandbox_image: String,
    pub sandbox_image_archive: Option<PathBuf>,
    pub pod_cidr: String,
    pub kubelet: KubeletTuning,
}

/// A setting that cannot work. Never carries file contents (a kubeconfig holds a key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub setting: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// A refusal on one line: a path may hold a newline (a YAML plain scalar folds blank
    /// lines into newlines, fuzz/regressions/config/newlines-in-a-quoted-path).
    pub fn new(setting: &str, message: impl Into<String>) -> Self {
        Self {
            setting: crate::text::one_line(setting),
            message: crate::text::one_line(&message.into()),
        }
    }
}

/// The parser's refusal, without the input: only its first line (the next ones quote the
/// input around the error, `fuzz/regressions/config/unknown-field-in-the-quoted-input`), and
/// a key only where it looks like a setting's name — an unknown one is named to point at the
/// typo — never a key that could be anything (a URL and its userinfo): the line and column
/// point at it (`fuzz/regressions/config/duplicate-key-holding-a-secret`).
fn parser_refusal(error: &str) -> ConfigError {
    let mut msg = first_line(error);
    const DUPLICATE: &str = "duplicate mapping key";
    if let Some(at) = msg.find(DUPLICATE) {
        msg.truncate(at + DUPLICATE.len());
        return bad("config", msg);
    }
    let unknown = msg
        .split('`')
        .nth(1)
        .filter(|_| msg.contains("unknown field"))
        .map(str::to_string);
    match unknown {
        Some(key) if looks_like_a_setting(&key) => bad(&key, msg),
        Some(_) => {
            let before = msg.split('`').next().unwrap_or_default();
            bad("config", format!("{before}(a key not shown)"))
        }
        None => bad("config", msg),
    }
}

/// A key a person could have meant as a setting: `kubeconfg`, `node_name`, `v1.34.12`.
fn looks_like_a_setting(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

pub(super) fn bad(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::new(setting, message)
}

impl Config {
    /// Reads and validates `path`. `hostname` is the default node name.
    pub fn load(path: &Path, hostname: &str) -> Result<Self, ConfigError> {
        let text = read_small(path, "config")?;
        Self::parse(&text, hostname)
    }

    /// The installed configuration, or the fault that keeps it from being read: missing,
    /// unreadable (an I/O error, not text), or a setting that cannot work.
    pub fn installed(path: &Path, hostname: &str) -> Result<Self, Fault> {
        match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Fault::new(FaultKind::ConfigMissing, path, ""));
            }
            Err(e) => return Err(Fault::new(FaultKind::ConfigUnreadable, path, e.to_string())),
            Ok(bytes) if std::str::from_utf8(&bytes).is_err() => {
                return Err(Fault::new(
                    FaultKind::ConfigUnreadable,
                    path,
                    "it is not text",
                ));
            }
            Ok(_) => {}
        }
        Self::load(path, hostname)
            .map_err(|e| Fault::new(FaultKind::ConfigInvalid, path, e.to_string()))
    }

    /// YAML or JSON (JSON is YAML).
    pub fn parse(text: &str, hostname: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile =
            serde_saphyr::from_str(text).map_err(|e| parser_refusal(&e.to_string()))?;
        file.validate(hostname)
    }

    /// The file `join` installs: the same settings, the files it copies at their installed
    /// paths.
    pub fn rendered(&self) -> ConfigFile {
        ConfigFile {
            node_name: Some(self.node_name.clone()),
            kubeconfig: Some(PathBuf::from(KUBECONFIG_PATH)),
            kubernetes_version: Some(self.kubernetes_version.clone()),
            install_mode: Some(self.install_mode.as_str().to_string()),
            trusted_ca_file: self
                .trusted_ca_file
                .as_ref()
                .map(|_| PathBuf::from(TRUSTED_CA_PATH)),
            registry_credentials_file: self
                .registry_credentials_file
                .as_ref()
                .map(|_| PathBuf::from(REGISTRY_CREDENTIALS_PATH)),
            agent_image: self.agent_image.as_ref().map(|a| a.image.to_string()),
            agent_image_digest: self.agent_image.as_ref().map(|a| a.digest.oci()),
            agent_image_archive: self.agent_image.as_ref().and_then(|a| a.archive.clone()),
            node_images: self
                .node
                .as_ref()
                .filter(|n| !n.images.pins.is_empty())
                .map(|n| {
                    n.images
                        .pins
                        .iter()
                        .map(|(v, i)| (v.clone(), format!("{}@{}", i.image, i.digest.oci())))
                        .collect()
                }),
            node_image: self
                .node
                .as_ref()
                .and_then(|n| n.images.pattern.as_ref())
                .map(|p| p.shown()),
            node_image_archive: self.node.as_ref().and_then(|n| n.images.archive.clone()),
            sandbox_image_archive: self
                .node
                .as_ref()
                .and_then(|n| n.sandbox_image_archive.clone()),
            kubelet: self
                .node
                .as_ref()
                .map(|n| n.kubelet.clone())
                .filter(|k| *k != KubeletTuning::default()),
            bootstrap_token_file: self
                .bootstrap_token_file
                .as_ref()
                .map(|_| PathBuf::from(BOOTSTRAP_TOKEN_PATH)),
            // Installed, the agent's credential is the kubeconfig `join` wrote.
            api_server: None,
            api_server_ca_file: None,
            agent_certificate_expiration_seconds: self.agent_certificate_expiration_seconds,
            agent_certificate_renew_at_percent: (self.renew_at != RenewAt::default())
                .then_some([self.renew_at.from_percent, self.renew_at.to_percent]),
            sandbox_image: self.node.as_ref().map(|n| n.sandbox_image.clone()),
            pod_cidr: self.node.as_ref().map(|n| n.pod_cidr.clone()),
            metrics_address: self.metrics_address.map(|a| a.to_string()),
            drain: drain::DrainFile::of(&self.drain),
        }
    }
}

impl ConfigFile {
    pub fn validate(self, hostname: &str) -> Result<Config, ConfigError> {
        let install_mode = match self.install_mode.as_deref().unwrap_or("host") {
            "host" => InstallMode::Host,
            "container" => InstallMode::Container,
            _ => return Err(bad("installMode", "must be \"host\" or \"container\"")),
        };
        let agent_image = agent_image(
            install_mode,
            self.agent_image.as_deref(),
            self.agent_image_digest.as_deref(),
        )?;
        let agent_image = with_archive(agent_image, self.agent_image_archive)?;
        let node_name = match self.node_name {
            Some(n) => n,
            None => hostname.trim().to_ascii_lowercase(),
        };
        if !is_dns_subdomain(&node_name) {
            return Err(bad(
                "nodeName",
                format!(
                    "{node_name:?} is not a DNS-1123 name (lowercase letters, digits, '-' and '.', \
                     at most 253 characters)"
                ),
            ));
        }
        let kubernetes_version = self
            .kubernetes_version
            .ok_or_else(|| bad("kubernetesVersion", "is required (for example v1.34.12)"))?;
        if !is_kubernetes_version(&kubernetes_version) {
            return Err(bad(
                "kubernetesVersion",
                format!("{kubernetes_version:?} is not a version like v1.34.12"),
            ));
        }
        let token_file = self.bootstrap_token_file;
        if let Some(path) = &token_file {
            check_bootstrap_token(path)?;
        }
        let (kubeconfig, token_join) = credential(
            self.kubeconfig,
            self.api_server,
            self.api_server_ca_file,
            token_file.is_some(),
        )?;
        let (expiration, renew_at) = certificate_life(
            self.agent_certificate_expiration_seconds,
            self.agent_certificate_renew_at_percent,
        )?;
        if let Some(path) = &self.trusted_ca_file {
            check_ca("trustedCAFile", path)?;
        }
        if let Some(path) = &self.registry_credentials_file {
            check_registry_credentials(path)?;
        }
        let plugin = match token_join {
            Some(_) => None,
            None => agent_plugin(&kubeconfig)?,
        };
        // The kubelet's first credential: the bootstrap token, or the agent's `flexnode token`.
        let kubelet_credential = token_file.is_some() || plugin.is_some();
        let node = node_config(
            &kubernetes_version,
            NodeKeys {
                pins: self.node_images,
                pattern: self.node_image,
                archive: self.node_image_archive,
                sandbox_image: self.sandbox_image,
                sandbox_image_archive: self.sandbox_image_archive,
                pod_cidr: self.pod_cidr,
                kubelet: self.kubelet,
            },
            kubelet_credential,
        )?;
        // The kubelet is given the agent's API server and cluster CA.
        if node.is_some() && token_join.is_none() {
            let (server, _) = kubeconfig_cluster(&kubeconfig)?;
            if !server.starts_with("https://") {
                return Err(bad(
                    "kubeconfig",
                    "its server must be an https URL: the kubelet is given it",
                ));
            }
        }
        let metrics_address = self
            .metrics_address
            .as_deref()
            .map(metrics_address)
            .transpose()?;
        Ok(Config {
            node_name,
            kubeconfig,
            token_join,
            bootstrap_token_file: token_file,
            agent_certificate_expiration_seconds: expiration,
            renew_at,
            kubernetes_version,
            install_mode,
            trusted_ca_file: self.trusted_ca_file,
            registry_credentials_file: self.registry_credentials_file,
            agent_image,
            node,
            metrics_address,
            drain: self.drain.unwrap_or_default().validate()?,
        })
    }
}

/// `metricsAddress`: `IP:PORT` on a loopback address. The metrics name operations and
/// transitions of the node: they are for a collector on the node, not for the network.
pub fn metrics_address(text: &str) -> Result<std::net::SocketAddr, ConfigError> {
    let addr: std::net::SocketAddr = text.parse().map_err(|_| {
        bad(
            "metricsAddress",
            format!("{text:?} is not IP:PORT (for example 127.0.0.1:9464)"),
        )
    })?;
    if !addr.ip().is_loopback() {
        return Err(bad(
            "metricsAddress",
            format!(
                "{addr} is not a loopback address: metrics are served on the node only \
                 (127.0.0.1:PORT or [::1]:PORT); a collector elsewhere scrapes through one \
                 on the node"
            ),
        ));
    }
    Ok(addr)
}

/// The container install's image with its offline archive, which goes into the bootstrap
/// unit's environment file: one plain word.
fn with_archive(
    agent_image: Option<AgentImage>,
    archive: Option<PathBuf>,
) -> Result<Option<AgentImage>, ConfigError> {
    Ok(match (agent_image, archive) {
        (image, None) => image,
        (None, Some(_)) => return Err(bad("agentImageArchive", ONLY_CONTAINER)),
        (Some(_), Some(path))
            if !path.is_absolute()
                || !path.to_str().is_some_and(|p| {
                    p.bytes()
                        .all(|b| b.is_ascii_graphic() && !b"\"'$\\`".contains(&b))
                }) =>
        {
            return Err(bad(
                "agentImageArchive",
                "must be an absolute path on the node, without spaces, quotes or `$`",
            ));
        }
        (Some(image), Some(path)) => Some(AgentImage {
            archive: Some(path),
            ..image
        }),
    })
}

/// The args of the agent's `flexnode token` plugin, if its kubeconfig runs one; a file it
/// reads where the agent's unit cannot see it is refused.
fn agent_plugin(kubeconfig: &Path) -> Result<Option<Vec<String>>, ConfigError> {
    let plugin = kube::config::Kubeconfig::read_from(kubeconfig)
        .ok()
        .as_ref()
        .and_then(kubeconfig::token_plugin);
    if let Some(hidden) = plugin.iter().flatten().find(|a| hidden_from_the_agent(a)) {
        return Err(bad(
            "kubeconfig",
            format!(
                "its `flexnode token` reads {hidden}, which the agent's unit cannot see \
                 (ProtectHome= hides /root, /home and /run/user): put it in /etc/flexnode"
            ),
        ));
    }
    Ok(plugin)
}

/// A path (or `--option=path`) under the directories the agent's unit does not see.
fn hidden_from_the_agent(arg: &str) -> bool {
    let path = arg.split_once('=').map_or(arg, |(_, v)| v);
    ["/root", "/home", "/run/user"]
        .iter()
        .any(|d| path == *d || path.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
}

/// The agent's certificate's life: the lifetime it asks for, and where in it it is renewed.
fn certificate_life(
    expiration: Option<i32>,
    renew_at_percent: Option<[u8; 2]>,
) -> Result<(Option<i32>, RenewAt), ConfigError> {
    if expiration.is_some_and(|s| s < MIN_CERTIFICATE_SECONDS) {
        return Err(bad(
            "agentCertificateExpirationSeconds",
            format!("must be at least {MIN_CERTIFICATE_SECONDS} (the API server's minimum)"),
        ));
    }
    let renew_at = match renew_at_percent {
        None => RenewAt::default(),
        Some([from, to]) if 1 <= from && from <= to && to <= 99 => RenewAt {
            from_percent: from,
            to_percent: to,
        },
        Some(_) => {
            return Err(bad(
                "agentCertificateRenewAtPercent",
                "must be [FROM, TO] with 1 <= FROM <= TO <= 99 (percent of the certificate's life)",
            ));
        }
    };
    Ok((expiration, renew_at))
}

/// The agent's credential: a kubeconfig, or what a bootstrap token join asks with (the API
/// server, its CA; the token is checked by the caller).
fn credential(
    kubeconfig: Option<PathBuf>,
    server: Option<String>,
    ca_file: Option<PathBuf>,
    has_token: bool,
) -> Result<(PathBuf, Option<TokenJoin>), ConfigError> {
    match (kubeconfig, server) {
        (Some(_), Some(_)) => Err(bad(
            "apiServer",
            "is for joining with a bootstrap token, without a kubeconfig: set one of the two",
        )),
        (Some(kubeconfig), None) => {
            if ca_file.is_some() {
                return Err(bad("apiServerCAFile", "goes with apiServer"));
            }
            check_kubeconfig(&kubeconfig)?;
            Ok((kubeconfig, None))
        }
        (None, Some(server)) => {
            let https = url::Url::parse(&server).is_ok_and(|u| {
                u.scheme() == "https" && u.host().is_some() && u.password().is_none()
            });
            if !https {
                return Err(bad(
                    "apiServer",
                    "must be an https:// URL of the API server (the value is not shown: it may \
                     carry credentials)",
                ));
            }
            let ca_file = ca_file.ok_or_else(|| {
                bad(
                    "apiServerCAFile",
                    "is required with apiServer: the cluster's CA, which the API server is \
                     verified with",
                )
            })?;
            check_ca("apiServerCAFile", &ca_file)?;
            if !has_token {
                return Err(bad(
                    "bootstrapTokenFile",
                    "is required with apiServer: the agent asks for its certificate with it",
                ));
            }
            Ok((
                PathBuf::from(KUBECONFIG_PATH),
                Some(TokenJoin { server, ca_file }),
            ))
        }
        (None, None) => Err(bad(
            "kubeconfig",
            "is required: the node's credential (a kubeconfig with a client certificate); or \
             apiServer, apiServerCAFile and bootstrapTokenFile to join with a bootstrap token",
        )),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests;
