//! What names an agent build and where an upgrade takes it from: the install mode, slots and
//! images, the CPU architecture, digests, archive URLs and image references. Plain values,
//! shared by the state, the inputs, the effects and the validation.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where the agent itself lives: a binary on the host, or privileged containers of its image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstallMode {
    Host,
    Container,
}

impl InstallMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Container => "container",
        }
    }
}

/// Host-install slots under `/opt/flexnode/lib/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Slot {
    Blue,
    Green,
}

impl Slot {
    pub fn other(self) -> Self {
        match self {
            Self::Blue => Self::Green,
            Self::Green => Self::Blue,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Blue => "blue",
            Self::Green => "green",
        }
    }
}

/// Which agent build runs (or should run): a slot for the host install, an image digest for
/// the container install. Install mode is thereby a parameter of every upgrade transition.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum AgentBuild {
    Slot { slot: Slot },
    Image { digest: Sha256Hex },
}

impl fmt::Display for AgentBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Slot { slot } => write!(f, "slot {}", slot.name()),
            Self::Image { digest } => write!(f, "image sha256:{}", digest.short()),
        }
    }
}

/// CPU architectures an agent build exists for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Amd64,
    Arm64,
    Unsupported,
}

impl Arch {
    /// Maps Rust's target architecture names onto the release naming.
    pub fn from_rust(arch: &str) -> Self {
        match arch {
            "x86_64" => Self::Amd64,
            "aarch64" => Self::Arm64,
            _ => Self::Unsupported,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
            Self::Unsupported => "unsupported",
        }
    }
}

/// A lowercase 64-hex SHA-256 value.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sha256Hex(String);

impl Sha256Hex {
    /// Accepts an optional `sha256:` prefix and either case; stores lowercase.
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        let hex = raw.strip_prefix("sha256:").unwrap_or(raw);
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| Self(hex.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The `sha256:<hex>` form OCI uses.
    pub fn oci(&self) -> String {
        format!("sha256:{}", self.0)
    }

    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl TryFrom<String> for Sha256Hex {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value).ok_or("not a 64-hex sha256 value")
    }
}

impl From<Sha256Hex> for String {
    fn from(value: Sha256Hex) -> Self {
        value.0
    }
}

impl fmt::Debug for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

impl fmt::Display for Sha256Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.0)
    }
}

/// An http(s) archive URL. It is kept whole for the download, but `Display` and `Debug` drop the
/// query (which may hold a SAS token), so journal lines and logs never carry it.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArchiveUrl(String);

impl ArchiveUrl {
    /// An http(s) URL `validate.rs` accepted.
    pub(super) fn validated(url: String) -> Self {
        Self(url)
    }

    /// The full URL, for the downloader only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ArchiveUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Display for ArchiveUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// The one URL redaction: a URL as messages, logs, the journal and the CLI may show it.
/// Userinfo becomes `<redacted>@`, a query `?<redacted>`, a fragment `#<redacted>`; scheme,
/// host and path stay. A URL is read as a WHATWG parser (the `url` crate, as validation and
/// downloads) reads it, so spellings it forgives (`https:/u:p@h`, backslashes, no slashes,
/// tabs) are redacted as what they mean. Anything else (not a URL) is shown up to its first
/// `?` or `#`, with what looks like userinfo redacted.
pub fn redact_url(raw: &str) -> String {
    const R: &str = "<redacted>";
    if let Ok(url) = url::Url::parse(raw) {
        let mut out = format!("{}:", url.scheme());
        if url.has_authority() {
            out.push_str("//");
            if !url.username().is_empty() || url.password().is_some() {
                out.push_str(R);
                out.push('@');
            }
            out.push_str(url.host_str().unwrap_or_default());
            if let Some(port) = url.port() {
                out.push_str(&format!(":{port}"));
            }
        }
        out.push_str(url.path());
        if url.query().is_some() {
            out.push('?');
            out.push_str(R);
        }
        if url.fragment().is_some() {
            out.push('#');
            out.push_str(R);
        }
        return out;
    }
    let cut = raw.find(['?', '#']).unwrap_or(raw.len());
    let (base, rest) = raw.split_at(cut);
    let mut out = match base.split_once("://") {
        Some((scheme, after)) => {
            let authority_end = after.find('/').unwrap_or(after.len());
            let (authority, path) = after.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((_, host)) => format!("{scheme}://{R}@{host}{path}"),
                None => base.to_string(),
            }
        }
        None => base.to_string(),
    };
    if rest.starts_with('?') {
        out.push('?');
        out.push_str(R);
    }
    if rest.contains('#') {
        out.push('#');
        out.push_str(R);
    }
    out
}

/// A fully qualified image repository with an optional tag, never a digest (the digest travels
/// separately in `sha256`). Validation leaves no room for userinfo, query or fragment.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
}

impl ImageRef {
    /// `registry/repository@sha256:…`, the form a pull by digest uses.
    pub fn pinned(&self, digest: &Sha256Hex) -> String {
        format!("{}/{}@{}", self.registry, self.repository, digest.oci())
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        match &self.tag {
            Some(tag) => write!(f, ":{tag}"),
            None => Ok(()),
        }
    }
}

/// What an accepted AgentUpgrade will install.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum UpgradeTarget {
    Archive { url: ArchiveUrl, sha256: Sha256Hex },
    Image { image: ImageRef, digest: Sha256Hex },
}

impl fmt::Display for UpgradeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Archive { url, sha256 } => write!(f, "{url} ({})", sha256.short()),
            Self::Image { image, digest } => write!(f, "{image}@{digest}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted_one_way() {
        for (raw, shown) in [
            ("https://a.example/f.tgz", "https://a.example/f.tgz"),
            (
                "https://a.example/f.tgz?sig=S&se=1",
                "https://a.example/f.tgz?<redacted>",
            ),
            (
                "https://u:p@a.example/f.tgz?sig=S",
                "https://<redacted>@a.example/f.tgz?<redacted>",
            ),
            (
                "https://a.example/f.tgz#tok",
                "https://a.example/f.tgz#<redacted>",
            ),
            (
                "https://a.example/f?x=1#y",
                "https://a.example/f?<redacted>#<redacted>",
            ),
            ("oci://registry.example/x:v1", "oci://registry.example/x:v1"),
            ("not a url?secret", "not a url?<redacted>"),
            // Spellings a WHATWG parser forgives mean the same URL (fuzz target archive_url).
            (
                "https:/u:p@a.example/f.tgz",
                "https://<redacted>@a.example/f.tgz",
            ),
            (
                "https:\\\\u:p@a.example\\f.tgz",
                "https://<redacted>@a.example/f.tgz",
            ),
            ("HTTPS:u:p@A.example/f", "https://<redacted>@a.example/f"),
            (
                " https://a.example/f?s\tig=1 ",
                "https://a.example/f?<redacted>",
            ),
            (
                "oci://u:p@registry.example/x",
                "oci://<redacted>@registry.example/x",
            ),
            ("file:///etc/passwd", "file:///etc/passwd"),
        ] {
            assert_eq!(redact_url(raw), shown, "{raw}");
        }
    }
}
