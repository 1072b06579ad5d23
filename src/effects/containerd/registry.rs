//! Registries, through oci-client (on the one HTTP stack, `effects/http.rs`): https with the
//! system trust store plus the configured CA (plain http only to a loopback registry), the
//! registry token flow (`WWW-Authenticate: Bearer`) or basic auth with credentials from a
//! 0600 file, redirects to blob storage, and the digest of every manifest and blob verified
//! (here while streaming, and again by containerd at commit). No message carries a
//! credential, a URL's query or a redirect target: errors are rebuilt from their kind.

use super::fetched::{Body, Fetched};
use super::oci_archive::OciArchive;
use super::{MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST};
use crate::effects::http::{self, Trust, describe, ensure_crypto_provider};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::{ImageRef, Sha256Hex};
use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::OnceCell;

/// How registries are reached: what TLS trusts, and where credentials come from (a Docker
/// `config.json`-style file: `{"auths": {"<registry>": {"auth": "<base64 user:password>"}}}`,
/// or `username`/`password` fields; read at every pull, mode 0600 or stricter).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryConfig {
    pub trust: Trust,
    pub credentials: Option<PathBuf>,
}

/// Which of the two a fetch asks for (manifests and blobs have their own endpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BlobKind {
    Manifest,
    Blob,
}

impl BlobKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Manifest => "manifest",
            Self::Blob => "blob",
        }
    }
}

/// `registry/repository@sha256:…`, as the agent accepts it: pinned, with a registry host,
/// without credentials or a tag. Public for the fuzz targets (`fuzz/`): what the validation of
/// an `oci://` reference accepts, a pull must accept too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryRef {
    /// As written in the reference (`127.0.0.1:5000`).
    pub registry: String,
    pub repository: String,
    pub digest: Sha256Hex,
}

impl RegistryRef {
    /// Parses a pinned reference; `digest` is the one the caller asked for and must match.
    pub fn parse(reference: &str, digest: &Sha256Hex) -> EffectResult<Self> {
        let bad = |why: &str| EffectError::Failed(format!("image reference: {why}"));
        let (name, pinned) = reference
            .rsplit_once('@')
            .ok_or_else(|| bad("not pinned by digest (registry/repository@sha256:…)"))?;
        let pinned = Sha256Hex::parse(pinned)
            .filter(|_| pinned.starts_with("sha256:"))
            .ok_or_else(|| bad("the digest after '@' is not sha256:<64 hex>"))?;
        if &pinned != digest {
            return Err(EffectError::Failed(format!(
                "image reference is pinned to {}, but {} was requested",
                pinned.oci(),
                digest.oci()
            )));
        }
        let repo = Repo::parse(name)?;
        Ok(Self {
            registry: repo.registry,
            repository: repo.repository,
            digest: pinned,
        })
    }

    /// `registry/repository`, as messages name the image.
    pub fn display(&self) -> String {
        self.repo().display()
    }

    /// `registry/repository@sha256:…`, the image record's name and what is pulled.
    pub fn pinned(&self) -> String {
        self.repo().at(&self.digest.oci())
    }

    pub(super) fn repo(&self) -> Repo {
        Repo {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
        }
    }
}

/// The digest the tag of `image` names at its registry now (a node image pattern resolved):
/// the registry reached as `config` says, each request within `timeout`.
/// With an `archive` there (an offline node's), the digest is the archive's and no registry
/// is asked.
pub async fn resolve_tag(
    image: &ImageRef,
    archive: Option<&Path>,
    config: &RegistryConfig,
    timeout: Duration,
) -> EffectResult<Sha256Hex> {
    let tag = image
        .tag
        .as_deref()
        .ok_or_else(|| EffectError::Failed(format!("image {image}: no tag to resolve")))?;
    if let Some(archive) = OciArchive::at(archive).await? {
        return archive.digest_of(tag);
    }
    let repo = Repo::parse(&format!("{}/{}", image.registry, image.repository))?;
    Registry::new(repo, config, timeout).digest_of(tag).await
}

/// A registry and a repository in it: what a session is opened for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Repo {
    pub(super) registry: String,
    pub(super) repository: String,
}

impl Repo {
    /// `registry/repository`, checked as the pull needs it.
    fn parse(name: &str) -> EffectResult<Self> {
        let bad = |why: &str| EffectError::Failed(format!("image reference: {why}"));
        let (registry, repository) = name
            .split_once('/')
            .ok_or_else(|| bad("no registry host"))?;
        if registry.contains('@') {
            // Never echo it: the part before '@' would be a credential.
            return Err(bad("credentials in image references are not supported"));
        }
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(bad("invalid registry host"));
        }
        if repository.is_empty()
            || repository.contains(':')
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
            || repository.split('/').any(str::is_empty)
        {
            return Err(bad("invalid repository name (tags are not allowed)"));
        }
        Ok(Self {
            registry: registry.to_string(),
            repository: repository.to_string(),
        })
    }

    pub(super) fn display(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    pub(super) fn at(&self, digest: &str) -> String {
        format!("{}/{}@{digest}", self.registry, self.repository)
    }

    /// A loopback registry may be plain http (a mirror on the node, a lab); every other is
    /// https.
    pub(super) fn plain_http_allowed(&self) -> bool {
        let host = match self.registry.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or_default(),
            None => self.registry.split(':').next().unwrap_or_default(),
        };
        host.eq_ignore_ascii_case("localhost")
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }
}

/// One registry and repository to pull from. Connected and authenticated on the first fetch
/// (so a pull whose content is all in the store, or in its archive, never needs the network),
/// then reused.
pub(super) struct Registry {
    pub(super) rr: Repo,
    config: RegistryConfig,
    timeout: Duration,
    session: OnceCell<(Client, RegistryAuth)>,
    /// Read before the registry: what an offline node's image comes from.
    archive: Option<OciArchive>,
}

impl Registry {
    pub(super) fn new(rr: Repo, config: &RegistryConfig, timeout: Duration) -> Self {
        Self {
            rr,
            config: config.clone(),
            timeout,
            session: OnceCell::new(),
            archive: None,
        }
    }

    pub(super) fn with_archive(mut self, archive: Option<OciArchive>) -> Self {
        self.archive = archive;
        self
    }

    /// Where blobs come from, as messages name it: the repository, and the archive read first.
    pub(super) fn origin(&self) -> String {
        match &self.archive {
            Some(a) => format!(
                "{} (image archive {} first)",
                self.rr.display(),
                a.path().display()
            ),
            None => self.rr.display(),
        }
    }

    /// A client for the registry, authenticated up front, so a refused credential or an
    /// untrusted certificate is reported as such before any content is written.
    async fn session(&self) -> EffectResult<&(Client, RegistryAuth)> {
        self.session.get_or_try_init(|| self.open()).await
    }

    async fn open(&self) -> EffectResult<(Client, RegistryAuth)> {
        ensure_crypto_provider();
        let rr = &self.rr;
        let failed =
            |what: String| EffectError::Failed(format!("registry {}: {what}", rr.display()));
        let extra = self.config.trust.extra_ca_pem()?;
        let plain = rr.plain_http_allowed() && !self.speaks_tls().await.map_err(failed)?;
        let certs = extra
            .map(|data| {
                vec![Certificate {
                    encoding: CertificateEncoding::Pem,
                    data,
                }]
            })
            .unwrap_or_default();
        let config = |system_store: bool| ClientConfig {
            protocol: if plain {
                ClientProtocol::HttpsExcept(vec![rr.registry.clone()])
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: if system_store { certs.clone() } else { vec![] },
            tls_certs_only: if system_store { vec![] } else { certs.clone() },
            read_timeout: Some(self.timeout),
            connect_timeout: Some(self.timeout),
            // reqwest still honours HTTP(S)_PROXY/NO_PROXY from the environment, as containerd
            // does.
            https_proxy: None,
            http_proxy: None,
            no_proxy: None,
            user_agent: "flexnode",
            ..Default::default()
        };
        // oci-client 0.18 builds a default reqwest client beside the configured one, and that
        // panics where the system store has no CA certificate at all (a minimal OS image): ask
        // reqwest first, which answers with an error.
        if let Err(e) = reqwest::Client::builder().build() {
            return Err(failed(format!(
                "this host's system trust store is unusable ({}); the registry client needs one \
                 even with trustedCAFile: install the CA certificates (Debian: ca-certificates)",
                describe(&e)
            )));
        }
        // The system store may still lack the registry's CA: then only trustedCAFile is
        // trusted (effects/http.rs does the same for archives).
        let client = match Client::try_from(config(true)) {
            Ok(client) => client,
            Err(_) if !certs.is_empty() => Client::try_from(config(false))
                .map_err(|e| failed(format!("cannot set up the client: {}", oci_error(&e))))?,
            Err(e) => {
                return Err(failed(format!(
                    "cannot set up the client: {} (this host has no usable CA certificates; \
                     install them or set trustedCAFile)",
                    oci_error(&e)
                )));
            }
        };
        let auth = credentials(self.config.credentials.as_deref(), &rr.registry)?;
        // The scope is the repository's; the tag stands for any.
        let scope =
            Reference::with_tag(rr.registry.clone(), rr.repository.clone(), "latest".into());
        client
            .auth(&scope, &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| failed(oci_error(&e)))?;
        Ok((client, auth))
    }

    /// Whether a loopback registry answers https. Asked first, as docker does for localhost;
    /// plain http only when the server does not speak TLS at all (its answer is not a TLS
    /// record), never after a certificate was refused.
    async fn speaks_tls(&self) -> Result<bool, String> {
        let client = http::client(&self.config.trust, self.timeout, self.timeout, 0)
            .map_err(|e| e.to_string())?;
        let url = format!("https://{}/v2/", self.rr.registry);
        match client.get(&url).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.is_redirect() => Ok(true),
            Err(e) if not_tls(&e) => Ok(false),
            Err(e) => Err(describe(&e)),
        }
    }

    /// The digest `tag` names at the registry now (a HEAD of its manifest). The answer is
    /// only a name: what is then pulled by it is checked against it.
    pub(super) async fn digest_of(&self, tag: &str) -> EffectResult<Sha256Hex> {
        let failed =
            |why: String| EffectError::Failed(format!("image {}:{tag}: {why}", self.rr.display()));
        let (client, auth) = self.session().await?;
        let tagged = Reference::with_tag(
            self.rr.registry.clone(),
            self.rr.repository.clone(),
            tag.to_string(),
        );
        let digest = client
            .fetch_manifest_digest(&tagged, auth)
            .await
            .map_err(|e| failed(oci_error(&e)))?;
        Sha256Hex::parse(&digest)
            .filter(|_| digest.starts_with("sha256:"))
            .ok_or_else(|| failed("the registry named no sha256 digest".into()))
    }

    pub(super) async fn fetch(&self, kind: BlobKind, digest: &str) -> EffectResult<Fetched> {
        let what = kind.name();
        let failed = |e: &OciDistributionError| {
            EffectError::Failed(format!(
                "{what} {digest} from {}: {}",
                self.rr.display(),
                oci_error(e)
            ))
        };
        if let Some(archive) = &self.archive
            && let Some(fetched) = archive.fetch(digest).await?
        {
            return Ok(fetched);
        }
        let (client, auth) = self.session().await?;
        let reference = reference(&self.rr.at(digest))?;
        match kind {
            BlobKind::Manifest => {
                let accepted = [
                    MEDIA_OCI_MANIFEST,
                    MEDIA_OCI_INDEX,
                    MEDIA_DOCKER_MANIFEST,
                    MEDIA_DOCKER_LIST,
                ];
                let (bytes, _digest) = client
                    .pull_manifest_raw(&reference, auth, &accepted)
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(Fetched {
                    content_length: Some(bytes.len() as u64),
                    content_type: None,
                    body: Body::Bytes(bytes.to_vec()),
                })
            }
            BlobKind::Blob => {
                let sized = client
                    .pull_blob_stream(&reference, digest)
                    .await
                    .map_err(|e| failed(&e))?;
                Ok(Fetched {
                    content_length: sized.content_length,
                    content_type: None,
                    body: Body::Stream(sized.stream.fuse(), bytes::Bytes::new()),
                })
            }
        }
    }
}

/// The peer answered a TLS ClientHello with something that is not a TLS record (an HTTP
/// server's "400 Bad Request").
fn not_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(rustls::Error::InvalidMessage(_)) = err.downcast_ref::<rustls::Error>() {
            return true;
        }
        source = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner),
            None => err.source(),
        };
    }
    false
}

/// A pinned reference as oci-client reads it (what the registry requests are built from).
pub fn reference(pinned: &str) -> EffectResult<Reference> {
    pinned
        .parse()
        .map_err(|_| EffectError::Failed("image reference: not a valid reference".into()))
}

/// An oci-client error as a message without URLs or response bodies (a registry's error body
/// or a storage redirect's query may carry anything).
fn oci_error(e: &OciDistributionError) -> String {
    match e {
        OciDistributionError::AuthenticationFailure(_) => {
            "authentication failed: the registry's token service refused the credentials".into()
        }
        OciDistributionError::UnauthorizedError { .. } => {
            "the registry refused access (HTTP 401): no or wrong credentials for it".into()
        }
        OciDistributionError::ImageManifestNotFoundError(_) => "not found".into(),
        OciDistributionError::ServerError { code, .. } => format!("HTTP {code}"),
        OciDistributionError::RegistryError { envelope, .. } => {
            use oci_client::errors::OciErrorCode as C;
            let codes: Vec<String> = envelope
                .errors
                .iter()
                .map(|e| format!("{:?}", e.code))
                .collect();
            let missing = envelope
                .errors
                .iter()
                .any(|e| matches!(e.code, C::ManifestUnknown | C::BlobUnknown | C::NameUnknown));
            if missing {
                format!("not found (the registry answered {})", codes.join(", "))
            } else {
                format!("the registry answered {}", codes.join(", "))
            }
        }
        OciDistributionError::DigestError(_) => "sha256 verification failed".into(),
        OciDistributionError::RequestError(r) => describe(r),
        OciDistributionError::IoError(io) => describe(io),
        OciDistributionError::RegistryTokenDecodeError(_) => {
            "the registry's token service sent an unreadable token".into()
        }
        OciDistributionError::UrlParseError(_) => "not a valid registry URL".into(),
        OciDistributionError::JsonError(_) => "the registry sent invalid JSON".into(),
        OciDistributionError::HeaderValueError(_) => {
            "the registry sent an unreadable header".into()
        }
        OciDistributionError::GenericError(_) => "the registry client failed".into(),
        OciDistributionError::RegistryNoDigestError
        | OciDistributionError::RegistryNoLocationError
        | OciDistributionError::PushNoDataError
        | OciDistributionError::PushLayerNoDataError
        | OciDistributionError::PullNoLayersError
        | OciDistributionError::ImageIndexParsingNoPlatformResolverError
        | OciDistributionError::ManifestEncodingError(_)
        | OciDistributionError::ConfigConversionError(_)
        | OciDistributionError::ManifestParsingError(_)
        | OciDistributionError::IncompatibleLayerMediaTypeError(_)
        | OciDistributionError::UnsupportedMediaTypeError(_)
        | OciDistributionError::UnsupportedSchemaVersionError(_)
        | OciDistributionError::VersionedParsingError(_)
        | OciDistributionError::SpecViolationError(_) => {
            // Parsing and protocol complaints: they name no URL; shortened, as they may quote
            // a document.
            let text = e.to_string();
            text.lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(200)
                .collect()
        }
    }
}

/// The credentials for `registry` from `file`, or anonymous. The file must not be readable
/// by group or others: it holds passwords.
fn credentials(file: Option<&Path>, registry: &str) -> EffectResult<RegistryAuth> {
    let Some(path) = file else {
        return Ok(RegistryAuth::Anonymous);
    };
    let failed =
        |why: &str| EffectError::Failed(format!("registry credentials {}: {why}", path.display()));
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => return Err(failed(&e.kind().to_string())),
    };
    if meta.mode() & 0o077 != 0 {
        return Err(failed("readable by group or others; it must be mode 0600"));
    }
    let text = crate::effects::fs::read_small(path, 1 << 20, true)?
        .ok_or_else(|| failed("vanished while being read"))?;
    Ok(match basic_credentials(&text, registry).map_err(failed)? {
        Some((user, pass)) => RegistryAuth::Basic(user, pass),
        None => RegistryAuth::Anonymous,
    })
}

/// The user and password for `registry` in a Docker `config.json`-shaped document (`auth`
/// = base64 `user:password`, or `username` and `password`); `None` when it has no entry.
/// The error never quotes the document: it holds passwords.
pub fn basic_credentials(
    doc: &str,
    registry: &str,
) -> Result<Option<(String, String)>, &'static str> {
    let doc: serde_json::Value = serde_json::from_str(doc).map_err(|_| "not valid JSON")?;
    let Some(entry) = doc.get("auths").and_then(|a| a.get(registry)) else {
        return Ok(None);
    };
    let field = |k: &str| {
        entry
            .get(k)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
    };
    if let (Some(user), Some(pass)) = (field("username"), field("password")) {
        return Ok(Some((user.to_string(), pass.to_string())));
    }
    let encoded = field("auth").ok_or("the entry has neither auth nor username/password")?;
    use base64::Engine;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| "auth is not base64")?;
    let decoded = String::from_utf8(decoded).map_err(|_| "auth is not UTF-8")?;
    let (user, pass) = decoded.split_once(':').ok_or("auth is not user:password")?;
    Ok(Some((user.to_string(), pass.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> Sha256Hex {
        Sha256Hex::parse(&"ab".repeat(32)).expect("digest")
    }

    /// Gathers small reads into chunks of `max`, and never polls the stream after its end
    /// (oci-client's verifying stream then reports a digest mismatch, as this one does).
    #[tokio::test]
    async fn chunks_gather_reads_and_stop_at_the_end() {
        let mut items = vec![&b"abc"[..], b"defgh", b"ij"].into_iter();
        let mut ended = false;
        let stream = futures::stream::poll_fn(move |_| {
            std::task::Poll::Ready(match items.next() {
                Some(b) => Some(Ok(bytes::Bytes::from_static(b))),
                None if !ended => {
                    ended = true;
                    None
                }
                None => Some(Err(std::io::Error::other("polled after the end"))),
            })
        });
        let mut body = Body::Stream(stream.boxed().fuse(), bytes::Bytes::new());
        let mut chunks = Vec::new();
        while let Some(c) = body.next_chunk(4).await.unwrap_or_else(|e| panic!("{e}")) {
            chunks.push(c);
        }
        assert_eq!(chunks, [&b"abcd"[..], b"efgh", b"ij"]);
        assert_eq!(body.next_chunk(4).await, Ok(None));
    }

    #[test]
    fn references_parse_strictly() {
        let d = digest();
        let r = RegistryRef::parse(&format!("127.0.0.1:5000/e2e/agent@{}", d.oci()), &d)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "e2e/agent");
        assert_eq!(r.pinned(), format!("127.0.0.1:5000/e2e/agent@{}", d.oci()));
        let err = |s: &str| match RegistryRef::parse(s, &d) {
            Err(EffectError::Failed(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        assert!(err("127.0.0.1:5000/e2e/agent:v1").contains("not pinned"));
        let m = err(&format!("user:secret@127.0.0.1/agent@{}", d.oci()));
        assert!(!m.contains("secret"), "{m}");
        let other = format!("sha256:{}", "cd".repeat(32));
        assert!(err(&format!("127.0.0.1/agent@{other}")).contains("requested"));
    }

    #[test]
    fn only_loopback_gets_plain_http() {
        let d = digest();
        for (reg, plain) in [
            ("127.0.0.1:5000", true),
            ("localhost:5000", true),
            ("[::1]:5000", true),
            ("registry.example.com", false),
            ("10.0.0.1:5000", false),
        ] {
            let r = RegistryRef::parse(&format!("{reg}/a@{}", d.oci()), &d)
                .unwrap_or_else(|e| panic!("{reg}: {e}"));
            assert_eq!(r.repo().plain_http_allowed(), plain, "{reg}");
        }
    }

    #[test]
    fn credentials_come_from_a_private_file_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("auth.json");
        // user:s3cret
        std::fs::write(
            &path,
            r#"{"auths": {"reg.example:5000": {"auth": "dXNlcjpzM2NyZXQ="}, "other": {"username": "u2", "password": "p2"}}}"#,
        )
        .expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let got = credentials(Some(&path), "reg.example:5000").expect("read");
        assert!(matches!(&got, RegistryAuth::Basic(u, p) if u == "user" && p == "s3cret"));
        let got = credentials(Some(&path), "other").expect("read");
        assert!(matches!(&got, RegistryAuth::Basic(u, p) if u == "u2" && p == "p2"));
        assert!(matches!(
            credentials(Some(&path), "elsewhere"),
            Ok(RegistryAuth::Anonymous)
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let m = match credentials(Some(&path), "reg.example:5000") {
            Err(EffectError::Failed(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(m.contains("0600") && !m.contains("s3cret"), "{m}");
        std::fs::write(&path, "{not json s3cret").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let m = match credentials(Some(&path), "reg.example:5000") {
            Err(EffectError::Failed(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(!m.contains("s3cret"), "{m}");
    }
}
