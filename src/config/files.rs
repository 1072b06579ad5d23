//! The files a configuration names, checked at load: private where they hold secrets, small,
//! and of the shape their setting needs. Their contents are never echoed.

use super::{ConfigError, MAX_FILE, bad};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The credential must be a private, readable kubeconfig naming a server and a user.
pub(super) fn check_kubeconfig(path: &Path) -> Result<(), ConfigError> {
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
    if let Some(why) = super::kubeconfig::first_unverified(&kc) {
        return Err(bad("kubeconfig", format!("{}: {why}", path.display())));
    }
    Ok(())
}

/// A secret's file: absolute, a regular file, owned by this user, not readable by others.
pub(super) fn check_private_file(
    setting: &str,
    path: &Path,
    holds: &str,
) -> Result<(), ConfigError> {
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

/// PEM certificates, at least one, in a regular file.
pub(super) fn check_ca(setting: &'static str, path: &Path) -> Result<(), ConfigError> {
    regular_file(setting, path)?;
    let pem = read_small(path, setting)?;
    match reqwest::Certificate::from_pem_bundle(pem.as_bytes()) {
        Ok(certs) if !certs.is_empty() => Ok(()),
        _ => Err(bad(
            setting,
            format!("{} holds no PEM certificate", path.display()),
        )),
    }
}

/// A private JSON file with an `auths` map (its contents are never echoed: they are
/// passwords).
pub(super) fn check_registry_credentials(path: &Path) -> Result<(), ConfigError> {
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

/// The API server and cluster CA (PEM) of the kubeconfig at `path`, in its current context's
/// cluster: what the machines' kubelet is given.
pub fn kubeconfig_cluster(path: &Path) -> Result<(String, Vec<u8>), ConfigError> {
    let text = read_small(path, "kubeconfig")?;
    let not = |what: &str| bad("kubeconfig", format!("{} {what}", path.display()));
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|_| not("is not a kubeconfig"))?;
    let context = kc
        .current_context
        .as_ref()
        .and_then(|name| kc.contexts.iter().find(|c| &c.name == name))
        .and_then(|c| c.context.as_ref().map(|c| c.cluster.clone()));
    let cluster = kc
        .clusters
        .iter()
        .find(|c| context.as_ref().is_none_or(|name| &c.name == name))
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| not("names no cluster"))?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| not("names no server"))?;
    let ca = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| not("has a certificate-authority-data that is not base64"))?
        }
        (None, Some(file)) => read_small(Path::new(file), "kubeconfig")?.into_bytes(),
        (None, None) => return Err(not("names no cluster CA")),
    };
    Ok((server, ca))
}

/// A private file holding one bootstrap token (never echoed).
pub(super) fn check_bootstrap_token(path: &Path) -> Result<(), ConfigError> {
    const SETTING: &str = "bootstrapTokenFile";
    check_private_file(SETTING, path, "holds a bootstrap token")?;
    let text = read_small(path, SETTING)?;
    if !crate::lifecycle::validate::valid_bootstrap_token(text.trim()) {
        return Err(bad(
            SETTING,
            format!(
                "{} does not hold a bootstrap token of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}",
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

pub(super) fn read_small(path: &Path, setting: &str) -> Result<String, ConfigError> {
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
