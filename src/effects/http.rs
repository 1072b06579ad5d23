//! The one HTTP stack: reqwest over rustls (ring), trusting the system store plus the CA the
//! configuration names (`trustedCAFile`), for archive downloads here and, through oci-client
//! (built on the same reqwest), for registry pulls (`containerd/registry.rs`). Messages built
//! from its errors never carry a URL: reqwest's own texts name the URL, so only the kind of
//! failure (TLS, connect, timeout, a refused redirect) is kept.

use super::{EffectError, EffectResult};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Redirects followed at most.
pub const MAX_REDIRECTS: usize = 10;

/// What TLS trusts: the system store, plus the certificates of a PEM file if one is named.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    pub extra_ca_file: Option<PathBuf>,
}

impl Trust {
    pub fn with_ca_file(path: impl Into<PathBuf>) -> Self {
        Self {
            extra_ca_file: Some(path.into()),
        }
    }

    /// The extra CA's PEM bytes (read at each use, so a rotated file takes effect).
    pub fn extra_ca_pem(&self) -> EffectResult<Option<Vec<u8>>> {
        let Some(path) = &self.extra_ca_file else {
            return Ok(None);
        };
        read_ca(path).map(Some)
    }
}

fn read_ca(path: &Path) -> EffectResult<Vec<u8>> {
    const MAX_CA_BYTES: u64 = 1 << 20;
    let bytes = super::fs::read_small(path, MAX_CA_BYTES, true)?.ok_or_else(|| {
        EffectError::Failed(format!("trusted CA file {} does not exist", path.display()))
    })?;
    Ok(bytes.into_bytes())
}

/// rustls needs a process-wide provider before any client is built (kube's is ring too).
pub fn ensure_crypto_provider() {
    // Err: one is installed already, which is all this wants.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why a redirect is not followed. Fixed strings only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedirectRefusal {
    TooMany,
    MissingLocation,
    InvalidLocation,
    UnsupportedScheme,
    Downgrade,
    Credentials,
}

impl RedirectRefusal {
    pub fn message(self) -> &'static str {
        match self {
            Self::TooMany => "too many redirects",
            Self::MissingLocation => "redirect without a location",
            Self::InvalidLocation => "redirect to an invalid location",
            Self::UnsupportedScheme => "redirect to a scheme other than http or https",
            Self::Downgrade => "redirect from https to http refused",
            Self::Credentials => "redirect to a URL with credentials refused",
        }
    }
}

impl std::fmt::Display for RedirectRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for RedirectRefusal {}

/// Where a redirect from `from` leads, after `followed` earlier redirects. The policy: at most
/// `max`, http(s) only, never from https to http, never credentials in the target.
pub fn redirect_target(
    from: &url::Url,
    location: Option<&str>,
    followed: usize,
    max: usize,
) -> Result<url::Url, RedirectRefusal> {
    if followed >= max {
        return Err(RedirectRefusal::TooMany);
    }
    let location = location.ok_or(RedirectRefusal::MissingLocation)?;
    let mut next = from
        .join(location)
        .map_err(|_| RedirectRefusal::InvalidLocation)?;
    match next.scheme() {
        "https" => {}
        "http" if from.scheme() == "https" => return Err(RedirectRefusal::Downgrade),
        "http" => {}
        _ => return Err(RedirectRefusal::UnsupportedScheme),
    }
    if !next.username().is_empty() || next.password().is_some() {
        return Err(RedirectRefusal::Credentials);
    }
    if next.host_str().is_none_or(str::is_empty) {
        return Err(RedirectRefusal::InvalidLocation);
    }
    next.set_fragment(None);
    Ok(next)
}

/// A client for downloads: `trust`, the redirect policy of [`redirect_target`] with `max`
/// redirects, `connect` and `read` timeouts (a read timeout bounds each wait for data).
pub fn client(
    trust: &Trust,
    connect: Duration,
    read: Duration,
    max_redirects: usize,
) -> EffectResult<reqwest::Client> {
    ensure_crypto_provider();
    let pem = trust.extra_ca_pem()?;
    let mut builder = base_builder(connect, read, max_redirects);
    if let Some(pem) = &pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|_| no_pem(trust))?;
        builder = builder.tls_certs_merge(certs);
    }
    let platform_error = match builder.build() {
        Ok(client) => return Ok(client),
        Err(e) => describe(&e),
    };
    // The platform verifier refuses to start on a host with no CA certificates at all (a
    // minimal OS image): downloads over http must still work, and https then trusts only
    // trustedCAFile.
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = &pem {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        for cert in CertificateDer::pem_slice_iter(pem) {
            roots
                .add(cert.map_err(|_| no_pem(trust))?)
                .map_err(|_| no_pem(trust))?;
        }
    }
    tracing::warn!(
        system_trust = %platform_error,
        "the system trust store is unusable; https trusts only trustedCAFile ({} certificates)",
        roots.len()
    );
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    base_builder(connect, read, max_redirects)
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(|e| EffectError::Failed(format!("HTTP client: {}", describe(&e))))
}

fn base_builder(connect: Duration, read: Duration, max_redirects: usize) -> reqwest::ClientBuilder {
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        let Some(from) = attempt.previous().last().cloned() else {
            return attempt.follow();
        };
        let followed = attempt.previous().len().saturating_sub(1);
        let to = attempt.url().as_str().to_string();
        match redirect_target(&from, Some(&to), followed, max_redirects) {
            Ok(_) => attempt.follow(),
            Err(refusal) => attempt.error(refusal),
        }
    });
    reqwest::Client::builder()
        .redirect(policy)
        .connect_timeout(connect)
        .read_timeout(read)
        .user_agent(format!("flexnode/{}", crate::VERSION))
}

fn no_pem(trust: &Trust) -> EffectError {
    EffectError::Failed(format!(
        "trusted CA file {} holds no PEM certificate",
        trust
            .extra_ca_file
            .as_deref()
            .unwrap_or(Path::new("?"))
            .display()
    ))
}

/// A transport error as a fixed description: the kind of TLS, connect, timeout or redirect
/// failure, never a URL.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut connect = false;
    let mut timeout = false;
    let mut kind: Option<std::io::ErrorKind> = None;
    while let Some(err) = source {
        if let Some(r) = err.downcast_ref::<reqwest::Error>() {
            connect |= r.is_connect();
            timeout |= r.is_timeout();
        }
        if let Some(refusal) = err.downcast_ref::<RedirectRefusal>() {
            return refusal.message().to_string();
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return tls_failure(tls);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            // The innermost specific kind wins over wrappers' `Other`.
            if kind.is_none() || io.kind() != std::io::ErrorKind::Other {
                kind = Some(io.kind());
            }
            if let Some(inner) = io.get_ref() {
                source = Some(inner);
                continue;
            }
        }
        source = err.source();
    }
    if timeout {
        return "timed out".into();
    }
    let what = if connect { "connect" } else { "transfer" };
    match kind {
        Some(kind) => format!("{what}: {kind}"),
        None if connect => "could not connect".into(),
        None => "transfer failed".into(),
    }
}

fn tls_failure(e: &rustls::Error) -> String {
    use rustls::{CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::UnknownIssuer) => "TLS: the server's certificate is not \
            signed by a CA this node trusts (the system store, plus trustedCAFile when set)"
            .into(),
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "TLS: the server's certificate is not valid for its name".into()
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "TLS: the server's certificate has expired".into()
        }
        other => format!("TLS: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_policy() {
        let https = url::Url::parse("https://a.example/x/y.tgz?sig=1").expect("url");
        let http = url::Url::parse("http://a.example/x/y.tgz").expect("url");
        assert_eq!(
            redirect_target(&https, Some("/z.tgz"), 0, 10).map(|u| u.to_string()),
            Ok("https://a.example/z.tgz".to_string())
        );
        // A relative Location keeps its own query.
        assert_eq!(
            redirect_target(&https, Some("/z.tgz?sig=S"), 0, 10).map(|u| u.to_string()),
            Ok("https://a.example/z.tgz?sig=S".to_string())
        );
        assert_eq!(
            redirect_target(&https, Some("https://b.example/q#f"), 9, 10).map(|u| u.to_string()),
            Ok("https://b.example/q".to_string())
        );
        assert_eq!(
            redirect_target(&https, Some("http://a.example/z.tgz"), 0, 10),
            Err(RedirectRefusal::Downgrade)
        );
        assert_eq!(
            redirect_target(&http, Some("https://a.example/z.tgz"), 0, 10)
                .map(|u| u.scheme().to_string()),
            Ok("https".to_string())
        );
        assert_eq!(
            redirect_target(&http, Some("ftp://a.example/z"), 0, 10),
            Err(RedirectRefusal::UnsupportedScheme)
        );
        assert_eq!(
            redirect_target(&http, Some("http://u:p@a.example/z"), 0, 10),
            Err(RedirectRefusal::Credentials)
        );
        assert_eq!(
            redirect_target(&http, None, 0, 10),
            Err(RedirectRefusal::MissingLocation)
        );
        assert_eq!(
            redirect_target(&http, Some("/z"), 10, 10),
            Err(RedirectRefusal::TooMany)
        );
    }
}
