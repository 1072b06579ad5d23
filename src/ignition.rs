//! A container install's first boot (`flexnode ignition`): what Ignition writes on the host
//! before anything of the agent runs, as a Butane config and the Ignition JSON it stands for.
//!
//! Nothing of the agent goes under `/usr`, `/opt` or `/usr/local`: the settings naming the
//! install's image by digest, the bootstrap inputs (the join config and the files it names,
//! removed after a successful bootstrap) and the bootstrap unit, which runs `flexnode join` in
//! a container of that image. Every file is 0600 (they hold credentials or name them).

use crate::config::{AgentImage, Config};
use crate::effects::containerd::basic_credentials;
use crate::lifecycle::agent::InstallMode;
use crate::units;
use base64::Engine;
use serde::Serialize;
use serde_saphyr::LitString;
use std::path::PathBuf;

/// The bootstrap inputs; `join` removes the directory once the node is joined.
pub const BOOTSTRAP_DIR: &str = "/etc/flexnode/bootstrap";
/// The install settings the bootstrap unit reads (`EnvironmentFile=`).
pub const INSTALL_ENV: &str = "/etc/flexnode/install.env";
pub const INSTALL_IMAGE_VAR: &str = "FLEXNODE_INSTALL_IMAGE";
/// The install image's repository (what `ctr images import --base-name` names it under).
pub const INSTALL_REPOSITORY_VAR: &str = "FLEXNODE_INSTALL_REPOSITORY";
/// The OCI archive the bootstrap unit imports first, when the config names one.
pub const INSTALL_ARCHIVE_VAR: &str = "FLEXNODE_INSTALL_ARCHIVE";
pub const BOOTSTRAP_UNIT: &str = "flexnode-bootstrap.service";
/// containerd's registry settings, one directory per registry host (what the bootstrap unit's
/// `ctr images pull --hosts-dir` reads).
pub const CONTAINERD_HOSTS_DIR: &str = "/etc/containerd/certs.d";

/// Flatcar is what Azure Container Linux is built on; its Butane 1.1.0 gives Ignition 3.4.0.
const BUTANE_VARIANT: &str = "flatcar";
const BUTANE_VERSION: &str = "1.1.0";
const IGNITION_VERSION: &str = "3.4.0";

const PRIVATE_DIR: u32 = 0o700;
const PRIVATE_FILE: u32 = 0o600;

/// The contents of the files the join config names (read by the caller).
pub struct Inputs {
    /// The agent's credential: a kubeconfig, or the API server's CA of a bootstrap token
    /// join (`apiServer`), whose certificate `join` obtains on the node.
    pub credential: Credential,
    pub trusted_ca: Option<String>,
    pub registry_credentials: Option<String>,
    /// The kubelet's bootstrap token file, when the config names node images.
    pub bootstrap_token: Option<String>,
}

pub enum Credential {
    Kubeconfig(String),
    ApiServerCa(String),
}

/// What Ignition writes: directories, files and units, in this order.
#[derive(Debug, PartialEq, Eq)]
pub struct Provisioning {
    pub directories: Vec<(String, u32)>,
    pub files: Vec<File>,
    /// (name, contents); every one enabled.
    pub units: Vec<(String, String)>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct File {
    pub path: String,
    pub mode: u32,
    pub contents: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IgnitionError {
    #[error(
        "installMode: `flexnode ignition` renders the container install; set installMode: container"
    )]
    NotContainer,
    #[error("render: {0}")]
    Render(String),
}

/// The provisioning for `config` (a validated container-install config) with the contents
/// of the files it names.
pub fn provisioning(config: &Config, inputs: Inputs) -> Result<Provisioning, IgnitionError> {
    let image = match (&config.install_mode, &config.agent_image) {
        (InstallMode::Container, Some(image)) => image,
        _ => return Err(IgnitionError::NotContainer),
    };
    let at = |name: &str| format!("{BOOTSTRAP_DIR}/{name}");
    let mut files = vec![
        File {
            path: INSTALL_ENV.into(),
            mode: PRIVATE_FILE,
            contents: install_env(image),
        },
        // What the bootstrap unit's `Documentation=` names, before any join wrote it.
        File {
            path: units::DOC_PATH.into(),
            mode: 0o644,
            contents: units::DOC.into(),
        },
    ];
    let mut directories = vec![
        ("/etc/flexnode".into(), PRIVATE_DIR),
        (BOOTSTRAP_DIR.into(), PRIVATE_DIR),
        ("/var/lib/flexnode".into(), PRIVATE_DIR),
    ];
    // The bootstrap unit's first pull is ctr's: it reads the registry's CA and credentials
    // from containerd's own hosts directory (`--hosts-dir`), never from its command line.
    let registry = &image.image.registry;
    let basic = inputs
        .registry_credentials
        .as_deref()
        .map(|doc| basic_credentials(doc, registry))
        .transpose()
        .map_err(|why| IgnitionError::Render(format!("registryCredentialsFile: {why}")))?
        .flatten();
    if inputs.trusted_ca.is_some() || basic.is_some() {
        if !registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(IgnitionError::Render(
                "agentImage: the registry name cannot be a directory name".into(),
            ));
        }
        let dir = format!("{CONTAINERD_HOSTS_DIR}/{registry}");
        let ca = inputs.trusted_ca.clone().map(|ca| {
            files.push(private(format!("{dir}/ca.crt"), ca));
            format!("{dir}/ca.crt")
        });
        files.push(private(
            format!("{dir}/hosts.toml"),
            hosts_toml(registry, ca.as_deref(), basic),
        ));
        directories.push((dir, PRIVATE_DIR));
    }
    let mut bootstrap = config.rendered();
    match inputs.credential {
        Credential::Kubeconfig(text) => {
            bootstrap.kubeconfig = Some(PathBuf::from(at("kubeconfig")));
            files.push(private(at("kubeconfig"), text));
        }
        Credential::ApiServerCa(ca) => {
            bootstrap.kubeconfig = None;
            bootstrap.api_server = config.token_join.as_ref().map(|t| t.server.clone());
            bootstrap.api_server_ca_file = Some(PathBuf::from(at("api-server-ca.pem")));
            files.push(private(at("api-server-ca.pem"), ca));
        }
    }
    bootstrap.trusted_ca_file = inputs.trusted_ca.map(|ca| {
        files.push(private(at("trusted-ca.pem"), ca));
        PathBuf::from(at("trusted-ca.pem"))
    });
    bootstrap.registry_credentials_file = inputs.registry_credentials.map(|c| {
        files.push(private(at("registry-credentials.json"), c));
        PathBuf::from(at("registry-credentials.json"))
    });
    bootstrap.bootstrap_token_file = inputs.bootstrap_token.map(|t| {
        files.push(private(at("bootstrap-token"), t));
        PathBuf::from(at("bootstrap-token"))
    });
    let rendered =
        serde_saphyr::to_string(&bootstrap).map_err(|e| IgnitionError::Render(e.to_string()))?;
    files.push(private(at("config.yaml"), rendered));
    let unit = units::for_mode(InstallMode::Container)
        .iter()
        .find(|(name, _)| *name == BOOTSTRAP_UNIT)
        .map(|(name, text)| (name.to_string(), text.to_string()))
        .ok_or_else(|| IgnitionError::Render(format!("no {BOOTSTRAP_UNIT}")))?;
    Ok(Provisioning {
        directories,
        files,
        units: vec![unit],
    })
}

fn private(path: String, contents: String) -> File {
    File {
        path,
        mode: PRIVATE_FILE,
        contents,
    }
}

/// containerd's registry settings (`hosts.toml`) for `registry`: https, the CA when one is
/// configured, and the credentials as a Basic `Authorization` header when the registry has
/// an entry in the credentials file.
fn hosts_toml(registry: &str, ca: Option<&str>, basic: Option<(String, String)>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = format!(
        "# Written by `flexnode ignition`: the bootstrap unit's first pull (ctr --hosts-dir).\n\
         server = \"https://{registry}\"\n\n[host.\"https://{registry}\"]\n\
         capabilities = [\"pull\", \"resolve\"]\n"
    );
    if let Some(ca) = ca {
        out.push_str(&format!("ca = \"{ca}\"\n"));
    }
    if let Some((user, pass)) = basic {
        out.push_str(&format!(
            "\n[host.\"https://{registry}\".header]\nAuthorization = \"Basic {}\"\n",
            b64.encode(format!("{user}:{pass}"))
        ));
    }
    out
}

fn install_env(image: &AgentImage) -> String {
    let mut env = format!(
        "# The container install's image, by digest (written by `flexnode ignition`).\n\
         {INSTALL_IMAGE_VAR}={}\n{INSTALL_REPOSITORY_VAR}={}/{}\n",
        image.pinned(),
        image.image.registry,
        image.image.repository
    );
    if let Some(archive) = &image.archive {
        env.push_str(&format!("{INSTALL_ARCHIVE_VAR}={}\n", archive.display()));
    }
    env
}

impl Provisioning {
    /// The Ignition config (spec 3.4.0): file contents as base64 `data:` URLs.
    pub fn ignition(&self) -> Result<String, IgnitionError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let doc = self.doc(
            Header::Ignition {
                ignition: IgnitionVersion {
                    version: IGNITION_VERSION,
                },
            },
            |f| Contents::Source {
                source: format!("data:;base64,{}", b64.encode(&f.contents)),
            },
            |text| UnitContents::Plain(text.to_string()),
        );
        serde_json::to_string_pretty(&doc).map_err(|e| IgnitionError::Render(e.to_string()))
    }

    /// The Butane config (variant flatcar 1.1.0) that `butane` translates to the same Ignition.
    pub fn butane(&self) -> Result<String, IgnitionError> {
        let doc = self.doc(
            Header::Butane {
                variant: BUTANE_VARIANT,
                version: BUTANE_VERSION,
            },
            |f| Contents::Inline {
                inline: LitString(f.contents.clone()),
            },
            |text| UnitContents::Literal(LitString(text.to_string())),
        );
        serde_saphyr::to_string(&doc).map_err(|e| IgnitionError::Render(e.to_string()))
    }

    /// The one document both formats share; they differ in the header and in how file and
    /// unit contents are written.
    fn doc(
        &self,
        header: Header,
        contents: impl Fn(&File) -> Contents,
        unit: impl Fn(&str) -> UnitContents,
    ) -> Doc<'_> {
        Doc {
            header,
            storage: Storage {
                directories: self
                    .directories
                    .iter()
                    .map(|(path, mode)| Directory { path, mode: *mode })
                    .collect(),
                files: self
                    .files
                    .iter()
                    .map(|f| FileEntry {
                        path: &f.path,
                        mode: f.mode,
                        overwrite: true,
                        contents: contents(f),
                    })
                    .collect(),
            },
            systemd: Systemd {
                units: self
                    .units
                    .iter()
                    .map(|(name, text)| Unit {
                        name,
                        enabled: true,
                        contents: unit(text),
                    })
                    .collect(),
            },
        }
    }
}

#[derive(Serialize)]
struct Doc<'a> {
    #[serde(flatten)]
    header: Header,
    storage: Storage<'a>,
    systemd: Systemd<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Header {
    Ignition {
        ignition: IgnitionVersion,
    },
    Butane {
        variant: &'static str,
        version: &'static str,
    },
}

#[derive(Serialize)]
struct IgnitionVersion {
    version: &'static str,
}

#[derive(Serialize)]
struct Storage<'a> {
    directories: Vec<Directory<'a>>,
    files: Vec<FileEntry<'a>>,
}

#[derive(Serialize)]
struct Directory<'a> {
    path: &'a str,
    mode: u32,
}

#[derive(Serialize)]
struct FileEntry<'a> {
    path: &'a str,
    mode: u32,
    overwrite: bool,
    contents: Contents,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Contents {
    /// Ignition: a `data:` URL.
    Source { source: String },
    /// Butane: the text, as a literal block.
    Inline { inline: LitString },
}

#[derive(Serialize)]
struct Systemd<'a> {
    units: Vec<Unit<'a>>,
}

#[derive(Serialize)]
struct Unit<'a> {
    name: &'a str,
    enabled: bool,
    contents: UnitContents,
}

#[derive(Serialize)]
#[serde(untagged)]
enum UnitContents {
    Plain(String),
    Literal(LitString),
}
