//! The agent's certificate obtained with a bootstrap token: kept when the kubeconfig already
//! holds a good one for this node (a `join` run again), otherwise asked for with a key made
//! here. The key is written (0600) before its request is sent, so a join that dies while it
//! waits sends the same request again and finds it; the kubeconfig is written whole, then
//! the waiting key removed. A denied or failed request is final: its key goes, and the next
//! attempt sends a new one.

use super::credential::{certificate_in, read_token, render, token_client};
use super::csr::{AgentKey, Issued};
use super::request::{Progress, RequestError, obtain};
use crate::effects::fs::{remove_no_follow, write_file_atomic};
use secrecy::SecretString;
use std::path::Path;
use std::time::Duration;

/// Beside the kubeconfig: the key whose request is out.
pub const PENDING_KEY: &str = "agent-key.pending";

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("{0}")]
    Io(String),
}

/// What a node that joins with a token asks with.
pub struct TokenRequest<'a> {
    pub node: &'a str,
    pub server: &'a str,
    pub ca_pem: &'a [u8],
    pub token: SecretString,
    pub expiration_seconds: Option<i32>,
    /// Where the agent's kubeconfig is (or goes).
    pub kubeconfig: &'a Path,
}

pub enum Obtained {
    /// The kubeconfig's certificate is this node's and has most of its life left.
    Kept(Issued),
    New(Issued),
}

/// Whether `cert` is `node`'s and has at least a tenth of its life left at `now` (Unix
/// seconds): a join keeps it rather than ask for another.
pub fn good_for(cert: &Issued, node: &str, now: i64) -> bool {
    let life = cert.not_after - cert.not_before;
    cert.common_name == super::agent_user(node) && now < cert.not_after - life / 10
}

fn io(what: &str, path: &Path, e: impl std::fmt::Display) -> BootstrapError {
    BootstrapError::Io(format!("{what} {}: {e}", path.display()))
}

/// The certificate in `r.kubeconfig`, obtained first if it is not good for the node.
pub async fn by_token(
    r: TokenRequest<'_>,
    now: i64,
    limit: Duration,
    progress: impl FnMut(Progress<'_>),
) -> Result<Obtained, BootstrapError> {
    if let Some(cert) = certificate_in(r.kubeconfig).filter(|c| good_for(c, r.node, now)) {
        return Ok(Obtained::Kept(cert));
    }
    let client = token_client(r.server, r.ca_pem, r.token)
        .await
        .map_err(RequestError::from)?;
    let cluster = (r.server, r.ca_pem);
    let cert = ask_and_write(
        &client,
        r.node,
        cluster,
        r.kubeconfig,
        r.expiration_seconds,
        limit,
        progress,
    )
    .await?;
    Ok(Obtained::New(cert))
}

/// Asks with `client` for `node`'s certificate under the key waiting beside `kubeconfig`
/// (made and written first when none waits), then writes the kubeconfig whole with the API
/// server and CA of `cluster`, and removes the waiting key.
pub(super) async fn ask_and_write(
    client: &kube::Client,
    node: &str,
    (server, ca_pem): (&str, &[u8]),
    kubeconfig: &Path,
    expiration_seconds: Option<i32>,
    limit: Duration,
    progress: impl FnMut(Progress<'_>),
) -> Result<Issued, BootstrapError> {
    let pending = kubeconfig.with_file_name(PENDING_KEY);
    let key = match std::fs::read_to_string(&pending) {
        Ok(pem) => AgentKey::from_pem(&pem).map_err(|e| io("the waiting key", &pending, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = AgentKey::generate().map_err(|e| io("a key for", &pending, e))?;
            write_file_atomic(&pending, key.pem().as_bytes(), 0o600)
                .map_err(|e| io("cannot write", &pending, e))?;
            key
        }
        Err(e) => return Err(io("cannot read", &pending, e)),
    };
    let obtained = obtain(client, node, &key, expiration_seconds, limit, progress).await;
    let (pem, cert) = match obtained {
        Ok(got) => got,
        // Decided for good: the next attempt (a token bound anew) sends a new request.
        Err(e @ (RequestError::Denied { .. } | RequestError::Failed { .. })) => {
            remove_no_follow(&pending).map_err(|e| io("cannot remove", &pending, e))?;
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    let text =
        render(server, ca_pem, &pem, &key).map_err(|e| io("cannot render", kubeconfig, e))?;
    write_file_atomic(kubeconfig, text.as_bytes(), 0o600)
        .map_err(|e| io("cannot write", kubeconfig, e))?;
    remove_no_follow(&pending).map_err(|e| io("cannot remove", &pending, e))?;
    Ok(cert)
}

/// At the daemon's start: a certificate that expired while the node was off, replaced through
/// the bootstrap token at `token_file` (the API server and CA as the kubeconfig names them).
/// `None`: nothing to replace (still valid, or no certificate of its own in the kubeconfig).
pub async fn replace_expired(
    node: &str,
    kubeconfig: &Path,
    token_file: Option<&Path>,
    expiration_seconds: Option<i32>,
    now: i64,
    limit: Duration,
) -> Result<Option<Issued>, BootstrapError> {
    let Some(cert) = certificate_in(kubeconfig).filter(|c| now >= c.not_after) else {
        return Ok(None);
    };
    let Some(token_file) = token_file else {
        return Err(BootstrapError::Io(
            "no bootstrapTokenFile is configured to replace it with".into(),
        ));
    };
    let token = read_token(token_file).map_err(|e| io("cannot read", token_file, e))?;
    let (server, ca_pem) = crate::config::kubeconfig_cluster(kubeconfig)
        .map_err(|e| io("cannot read", kubeconfig, e))?;
    tracing::warn!(
        expired_at = cert.not_after,
        "the agent's certificate expired while the node was off; asking for a new one with the bootstrap token"
    );
    let request = TokenRequest {
        node,
        server: &server,
        ca_pem: &ca_pem,
        token,
        expiration_seconds,
        kubeconfig,
    };
    match by_token(request, now, limit, |_| {}).await? {
        Obtained::New(new) | Obtained::Kept(new) => Ok(Some(new)),
    }
}
