//! The agent's kubeconfig as the node makes it from a certificate it obtained: the API server,
//! its CA, the certificate and its key, all inline in one 0600 file; and the bootstrap
//! token's client that obtains it.

use super::csr::{AgentKey, Issued};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use secrecy::SecretString;
use std::path::Path;

const NAME: &str = "flexnode";

fn kubeconfig(server: &str, ca_pem: &[u8], user: AuthInfo) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: NAME.into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority_data: Some(STANDARD.encode(ca_pem)),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.into(),
            auth_info: Some(user),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: NAME.into(),
            context: Some(Context {
                cluster: NAME.into(),
                user: Some(NAME.into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(NAME.into()),
        ..Default::default()
    }
}

/// The kubeconfig text of a certificate and its key (it holds the key: written 0600).
pub fn render(
    server: &str,
    ca_pem: &[u8],
    cert_pem: &str,
    key: &AgentKey,
) -> Result<String, serde_json::Error> {
    let user = AuthInfo {
        client_certificate_data: Some(STANDARD.encode(cert_pem)),
        client_key_data: Some(SecretString::from(STANDARD.encode(key.pem()))),
        ..Default::default()
    };
    serde_json::to_string_pretty(&kubeconfig(server, ca_pem, user))
}

/// A client of the API server at `server` (verified with `ca_pem`) that authenticates with a
/// bootstrap token; the token stays in memory.
pub async fn token_client(
    server: &str,
    ca_pem: &[u8],
    token: SecretString,
) -> Result<kube::Client, kube::Error> {
    let user = AuthInfo {
        token: Some(token),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig(server, ca_pem, user),
        &KubeConfigOptions::default(),
    )
    .await
    .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}

/// The bootstrap token in `path` (`abcdef.0123456789abcdef`), held as a secret.
pub fn read_token(path: &Path) -> std::io::Result<SecretString> {
    Ok(std::fs::read_to_string(path)?.trim().to_string().into())
}

/// The certificate inline in the kubeconfig at `path` (a client certificate of the user its
/// current context selects), if it has one.
pub fn certificate_in(path: &Path) -> Option<Issued> {
    let kc = Kubeconfig::read_from(path).ok()?;
    let data = crate::config::kubeconfig::current_user(&kc)?
        .client_certificate_data
        .clone()?;
    Issued::from_pem(&STANDARD.decode(data).ok()?).ok()
}
