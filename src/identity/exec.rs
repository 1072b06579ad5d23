//! Exec credentials (`client.authentication.k8s.io/v1`): `flexnode token` is a kubeconfig's
//! `exec` plugin that gets a bearer token from an identity provider — with a client secret
//! read from a private file (a service principal's shape: the OAuth 2 client-credentials
//! grant), or from a metadata endpoint on the node (a managed identity's shape) — and prints
//! it as an `ExecCredential`. The API server's JWT authenticator maps the token's claims to
//! the agent's identity (`system:flexnode:<node>`, group `flexnode:agents`) or, for the
//! audience `kubelet`, the node's (`system:node:<node>`); docs/config.md, "Exec credentials".
//!
//! A kubeconfig's exec command `flexnode` names this very binary wherever it runs (the join,
//! the installed agent, its image's container), so one kubeconfig serves them all
//! (src/config/kubeconfig.rs, `resolve_self`).

use crate::effects::http::{Trust, client, describe};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The exec plugin API this plugin speaks.
pub const EXEC_API_VERSION: &str = "client.authentication.k8s.io/v1";

/// Where the token comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// An OAuth 2 token endpoint, with a client ID and the secret in a private file.
    ClientSecret {
        token_url: String,
        client_id: String,
        secret_file: PathBuf,
    },
    /// A metadata endpoint on the node that answers `GET ?resource=AUDIENCE` with header
    /// `Metadata: true` (the node is the identity: no secret on it).
    Metadata { url: String },
}

/// A bearer token and when it stops working (unix seconds).
pub struct Token {
    pub token: SecretString,
    pub expires_at: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{0}")]
    Input(String),
    #[error("the identity provider could not be reached: {0}")]
    Unreachable(String),
    #[error("the identity provider refused: HTTP {status}{detail}")]
    Refused { status: u16, detail: String },
    #[error("the identity provider's answer is not a token response: {0}")]
    BadAnswer(String),
}

/// The provider's answer: OAuth 2's `expires_in` (seconds, a number or, as Azure's metadata
/// endpoint sends it, a string) or `expires_on` (unix seconds).
#[derive(Deserialize)]
struct Answer {
    access_token: Option<String>,
    expires_in: Option<serde_json::Value>,
    expires_on: Option<serde_json::Value>,
    error: Option<String>,
    error_description: Option<String>,
}

fn seconds(v: Option<&serde_json::Value>) -> Option<i64> {
    match v? {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The longest a request to the provider takes.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read: a token response is a few KiB.
const MAX_ANSWER: usize = 64 * 1024;

/// A token for `audience` from `source`; `now` in unix seconds.
pub async fn fetch(
    source: &Source,
    audience: &str,
    ca_file: Option<&Path>,
    now: i64,
) -> Result<Token, ExecError> {
    let trust = ca_file.map(Trust::with_ca_file).unwrap_or_default();
    let http = client(&trust, TIMEOUT, TIMEOUT, 0).map_err(|e| ExecError::Input(e.to_string()))?;
    let request = match source {
        Source::ClientSecret {
            token_url,
            client_id,
            secret_file,
        } => {
            let secret = read_secret(secret_file)?;
            let form: String = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("grant_type", "client_credentials")
                .append_pair("client_id", client_id)
                .append_pair("client_secret", secret.expose_secret())
                .append_pair("scope", audience)
                .finish();
            http.post(parse_url(token_url)?)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(form)
        }
        Source::Metadata { url } => {
            let mut url = parse_url(url)?;
            url.query_pairs_mut().append_pair("resource", audience);
            http.get(url).header("Metadata", "true")
        }
    };
    let mut response = request
        .timeout(TIMEOUT)
        .send()
        .await
        .map_err(|e| ExecError::Unreachable(describe(&e)))?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ExecError::Unreachable(describe(&e)))?
    {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(ExecError::BadAnswer(format!(
                "larger than {MAX_ANSWER} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    let answer: Option<Answer> = serde_json::from_slice(&body).ok();
    if !status.is_success() {
        // The provider's own error code and description (never the request's secret).
        let detail = match answer {
            Some(Answer {
                error: Some(e),
                error_description: Some(d),
                ..
            }) => format!(": {e} ({d})"),
            Some(Answer { error: Some(e), .. }) => format!(": {e}"),
            _ => String::new(),
        };
        return Err(ExecError::Refused {
            status: status.as_u16(),
            detail,
        });
    }
    let answer = answer.ok_or_else(|| ExecError::BadAnswer("not JSON".into()))?;
    let token: SecretString = answer
        .access_token
        .ok_or_else(|| ExecError::BadAnswer("no access_token".into()))?
        .into();
    let expires_at = seconds(answer.expires_on.as_ref())
        .or_else(|| seconds(answer.expires_in.as_ref()).map(|s| now + s))
        .ok_or_else(|| ExecError::BadAnswer("neither expires_in nor expires_on".into()))?;
    Ok(Token { token, expires_at })
}

fn parse_url(text: &str) -> Result<url::Url, ExecError> {
    let url = url::Url::parse(text)
        .map_err(|e| ExecError::Input(format!("{text:?} is not a URL: {e}")))?;
    // http only to a link-local or loopback metadata endpoint; anything else carries a secret
    // or a token and must be https.
    let local = url.host().is_some_and(|h| match h {
        url::Host::Ipv4(ip) => ip.is_link_local() || ip.is_loopback(),
        url::Host::Ipv6(ip) => ip.is_loopback(),
        url::Host::Domain(d) => d == "localhost",
    });
    match url.scheme() {
        "https" => Ok(url),
        "http" if local => Ok(url),
        _ => Err(ExecError::Input(format!(
            "{text:?}: the identity provider must be https (http only on a link-local or \
             loopback address)"
        ))),
    }
}

/// The client secret: a private file (0600, not a symlink's target elsewhere), trimmed.
fn read_secret(path: &Path) -> Result<SecretString, ExecError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| ExecError::Input(format!("client secret file {}: {e}", path.display())))?;
    if !meta.is_file() || meta.permissions().mode() & 0o077 != 0 {
        return Err(ExecError::Input(format!(
            "client secret file {} must be a regular file not accessible by group or others \
             (chmod 600)",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| ExecError::Input(format!("client secret file {}: {e}", path.display())))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(ExecError::Input(format!(
            "client secret file {} is empty",
            path.display()
        )));
    }
    Ok(secret.to_string().into())
}

/// The `ExecCredential` a plugin prints: the token and when the client should run the plugin
/// again — a fifth of its life (at most a minute) before it expires, so that no request is
/// sent with a token about to expire (clients use it until that moment).
pub fn exec_credential(token: &Token, now: i64) -> String {
    let margin = ((token.expires_at - now) / 5).clamp(0, 60);
    serde_json::json!({
        "apiVersion": EXEC_API_VERSION,
        "kind": "ExecCredential",
        "status": {
            "token": token.token.expose_secret(),
            "expirationTimestamp": crate::lifecycle::time::Timestamp::from_millis(
                (token.expires_at - margin).saturating_mul(1000)).rfc3339(),
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_read_as_a_number_or_a_string() {
        assert_eq!(seconds(Some(&serde_json::json!(3599))), Some(3599));
        assert_eq!(seconds(Some(&serde_json::json!("3599"))), Some(3599));
        assert_eq!(seconds(Some(&serde_json::json!(["x"]))), None);
    }

    #[test]
    fn a_secret_or_token_goes_only_over_https_or_to_a_local_endpoint() {
        assert!(parse_url("https://login.example/token").is_ok());
        assert!(parse_url("http://169.254.169.254/metadata/identity/oauth2/token").is_ok());
        assert!(parse_url("http://127.0.0.1:8080/token").is_ok());
        let e = parse_url("http://login.example/token").expect_err("plain http");
        assert!(e.to_string().contains("must be https"), "{e}");
    }

    #[test]
    fn the_credential_carries_the_token_and_its_expiry() {
        let text = exec_credential(
            &Token {
                token: "t0k".to_string().into(),
                expires_at: 1_800_000_000,
            },
            1_800_000_000 - 3600,
        );
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["apiVersion"], EXEC_API_VERSION);
        assert_eq!(v["status"]["token"], "t0k");
        // A minute early: the client asks again before the token expires.
        assert_eq!(v["status"]["expirationTimestamp"], "2027-01-15T07:59:00Z");
    }
}
