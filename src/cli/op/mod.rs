//! `flexnode op`: create and inspect MachineOperations, for operators and controllers.
//!
//! Upgrade parameters go through the agent's own validation before anything is created, and a
//! download URL is never printed whole: it may carry a SAS token in its query or credentials in
//! its userinfo. `command.rs` holds the subcommands; this file what they share.

pub mod command;
pub mod create;
pub(crate) mod follow;
pub mod show;

use super::Failure;
use crate::api::MachineOperation;
use kube::api::Api;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

const FIELD_MANAGER: &str = "flexnode-op";
const REDACTED: &str = "<redacted>";

/// The resolved kubeconfig path: `--kubeconfig`, else the first `$KUBECONFIG` entry, else
/// `~/.kube/config`.
fn kubeconfig_path(flag: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(p) = flag {
        return Ok(p);
    }
    if let Some(v) = std::env::var_os("KUBECONFIG")
        && let Some(first) = std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty())
    {
        return Ok(first);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".kube/config")),
        None => Err(Failure::config(
            "no kubeconfig: pass --kubeconfig or set KUBECONFIG",
        )),
    }
}

async fn ops(flag: Option<PathBuf>) -> Result<Api<MachineOperation>, Failure> {
    Ok(Api::all(client(flag).await?))
}

/// A client from the operator's kubeconfig (`--kubeconfig`, `$KUBECONFIG`, `~/.kube/config`);
/// one that is missing or would not verify the API server is an impossible setting (78).
pub(crate) async fn client(flag: Option<PathBuf>) -> Result<kube::Client, Failure> {
    let path = kubeconfig_path(flag)?;
    if !path.is_file() {
        return Err(Failure::config(format!(
            "kubeconfig {} not found (pass --kubeconfig or set KUBECONFIG)",
            path.display()
        )));
    }
    match crate::config::kubeconfig::client_from_kubeconfig(&path).await {
        Ok(client) => Ok(client),
        Err(kube::Error::InferKubeconfig(e)) => Err(Failure::config(format!(
            "kubeconfig {}: {e}",
            path.display()
        ))),
        Err(e) => Err(Failure::config(format!(
            "kubeconfig {}: {}",
            path.display(),
            api_message(&e)
        ))),
    }
}

pub(crate) use crate::config::kubeconfig::api_message;

// ---- create ------------------------------------------------------------------------------

// ---- list and get ------------------------------------------------------------------------

fn api_failure(e: &kube::Error) -> Failure {
    Failure::failed(api_message(e))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
