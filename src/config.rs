//! The node's configuration (`flexnode join --config FILE`, `/etc/flexnode/config.yaml`).
//! Schema and the list of impossible settings: docs/config.md. An impossible setting is a
//! `ConfigError` naming it; the CLI exits 78 for those, and the bootstrap unit never retries.

use crate::machine::agent::{ImageRef, InstallMode, Sha256Hex};
use crate::machine::validate::{InvalidParameter, parse_oci_url};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where `join` installs the rendered configuration and the node's credential.
pub const CONFIG_PATH: &str = "/etc/flexnode/config.yaml";
pub const KUBECONFIG_PATH: &str = "/etc/flexnode/kubeconfig";
pub const TRUSTED_CA_PATH: &str = "/etc/flexnode/trusted-ca.pem";
pub const REGISTRY_CREDENTIALS_PATH: &str = "/etc/flexnode/registry-credentials.json";
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
}

/// The container install's image, pinned by digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentImage {
    pub image: ImageRef,
    pub digest: Sha256Hex,
    /// An OCI archive holding it, on the node (absolute path).
    pub archive: Option<PathBuf>,
}

impl AgentImage {
    /// `registry/repository@sha256:…`, what a pull by digest and `ctr` take.
    pub fn pinned(&self) -> String {
        self.image.pinned(&self.digest)
    }
}

/// A validated configuration: every field usable as is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub node_name: String,
    pub kubeconfig: PathBuf,
    pub kubernetes_version: String,
    pub install_mode: InstallMode,
    /// Certificates trusted for https downloads and registries beyond the system store.
    pub trusted_ca_file: Option<PathBuf>,
    /// Registry credentials (Docker `config.json` shape), private to root.
    pub registry_credentials_file: Option<PathBuf>,
    /// The container install's image; `None` on the host install.
    pub agent_image: Option<AgentImage>,
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

fn bad(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        message: message.into(),
    }
}

impl Config {
    /// Reads and validates `path`. `hostname` is the default node name.
    pub fn load(path: &Path, hostname: &str) -> Result<Self, ConfigError> {
        let text = read_small(path, "config")?;
        Self::parse(&text, hostname)
    }

    /// YAML or JSON (JSON is YAML).
    pub fn parse(text: &str, hostname: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile = serde_saphyr::from_str(text).map_err(|e| {
            let msg = e.to_string();
            // serde names the offending key; the value is never echoed back.
            let setting = msg
                .split('`')
                .nth(1)
                .filter(|_| msg.contains("unknown field"))
                .unwrap_or("config");
            bad(setting, first_line(&msg))
        })?;
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
        let agent_image = match (agent_image, self.agent_image_archive) {
            (image, None) => image,
            (None, Some(_)) => return Err(bad("agentImageArchive", ONLY_CONTAINER)),
            // It goes into the bootstrap unit's environment file: one plain word.
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
        };
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
        let kubeconfig = self.kubeconfig.ok_or_else(|| {
            bad(
                "kubeconfig",
                "is required: the node's credential (a kubeconfig with a client certificate)",
            )
        })?;
        check_kubeconfig(&kubeconfig)?;
        if let Some(path) = &self.trusted_ca_file {
            check_trusted_ca(path)?;
        }
        if let Some(path) = &self.registry_credentials_file {
            check_registry_credentials(path)?;
        }
        Ok(Config {
            node_name,
            kubeconfig,
            kubernetes_version,
            install_mode,
            trusted_ca_file: self.trusted_ca_file,
            registry_credentials_file: self.registry_credentials_file,
            agent_image,
        })
    }
}

/// The container install names its image by digest; the host install names none. Messages
/// are fixed: a reference may carry a token in its query, so none is echoed.
fn agent_image(
    mode: InstallMode,
    image: Option<&str>,
    digest: Option<&str>,
) -> Result<Option<AgentImage>, ConfigError> {
    if mode == InstallMode::Host {
        return match (image, digest) {
            (None, None) => Ok(None),
            (Some(_), _) => Err(bad("agentImage", ONLY_CONTAINER)),
            (None, Some(_)) => Err(bad("agentImageDigest", ONLY_CONTAINER)),
        };
    }
    let image = image.ok_or_else(|| {
        bad(
            "agentImage",
            "is required for the container install: oci://REGISTRY/REPOSITORY[:TAG]",
        )
    })?;
    let image = parse_oci_url(image.trim()).map_err(|e| {
        bad(
            "agentImage",
            match e {
                InvalidParameter::DigestInImageReference => {
                    "must not embed a digest; put it in agentImageDigest"
                }
                _ => "is not an oci://REGISTRY/REPOSITORY[:TAG] reference",
            },
        )
    })?;
    let digest = digest.ok_or_else(|| {
        bad(
            "agentImageDigest",
            "is required for the container install: the image's sha256:<64 hex> digest",
        )
    })?;
    let digest = Sha256Hex::parse(digest).ok_or_else(|| {
        bad(
            "agentImageDigest",
            "must be sha256:<64 hexadecimal characters>",
        )
    })?;
    Ok(Some(AgentImage {
        image,
        digest,
        archive: None,
    }))
}

const ONLY_CONTAINER: &str = "only the container install runs an agent image";

/// The credential must be a private, readable kubeconfig naming a server and a user.
fn check_kubeconfig(path: &Path) -> Result<(), ConfigError> {
    check_private_file("kubeconfig", path, "holds a private key")?;
    let text = read_small(path, "kubeconfig")?;
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|_| {
        bad(
            "kubeconfig",
            format!("{} is not a kubeconfig", path.display()),
        )
    })?;
    let has_server = kc
        .clusters
        .iter()
        .any(|c| c.cluster.as_ref().and_then(|c| c.server.as_ref()).is_some());
    if !has_server || kc.auth_infos.is_empty() {
        return Err(bad(
            "kubeconfig",
            format!("{} names no API server or no user", path.display()),
        ));
    }
    Ok(())
}

/// A secret's file: absolute, a regular file, owned by this user, not readable by others.
fn check_private_file(setting: &str, path: &Path, holds: &str) -> Result<(), ConfigError> {
    let meta = regular_file(setting, path)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(
            setting,
            format!(
                "{} {holds} and must not be accessible by group or others (chmod 600)",
                path.display()
            ),
        ));
    }
    if process_uid().is_some_and(|uid| meta.uid() != uid) {
        return Err(bad(
            setting,
            format!(
                "{} must be owned by the user running flexnode",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn regular_file(setting: &str, path: &Path) -> Result<std::fs::Metadata, ConfigError> {
    if !path.is_absolute() {
        return Err(bad(setting, "must be an absolute path"));
    }
    let meta =
        std::fs::metadata(path).map_err(|e| bad(setting, format!("{}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(bad(
            setting,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(meta)
}

/// PEM certificates, at least one.
fn check_trusted_ca(path: &Path) -> Result<(), ConfigError> {
    const SETTING: &str = "trustedCAFile";
    regular_file(SETTING, path)?;
    let pem = read_small(path, SETTING)?;
    match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
        Ok(certs) if !certs.is_empty() => Ok(()),
        _ => Err(bad(
            SETTING,
            format!("{} holds no PEM certificate", path.display()),
        )),
    }
}

/// A private JSON file with an `auths` map (its contents are never echoed: they are
/// passwords).
fn check_registry_credentials(path: &Path) -> Result<(), ConfigError> {
    const SETTING: &str = "registryCredentialsFile";
    check_private_file(SETTING, path, "holds passwords")?;
    let text = read_small(path, SETTING)?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| bad(SETTING, format!("{} is not valid JSON", path.display())))?;
    if !doc.get("auths").is_some_and(serde_json::Value::is_object) {
        return Err(bad(
            SETTING,
            format!(
                "{} has no \"auths\" object (the Docker config.json shape)",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The user this process runs as (the owner of `/proc/self`).
pub fn process_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").map(|m| m.uid()).ok()
}

fn read_small(path: &Path, setting: &str) -> Result<String, ConfigError> {
    let meta =
        std::fs::metadata(path).map_err(|e| bad(setting, format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_FILE {
        return Err(bad(
            setting,
            format!("{} is larger than 1 MiB", path.display()),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| bad(setting, format!("{}: {e}", path.display())))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}

/// RFC 1123 subdomain, as Kubernetes requires of Node names.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn is_kubernetes_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let container = format!(
            "installMode: container\nagentImage: oci://r.example/a\nagentImageDigest: {hex}\n"
        );
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
}
