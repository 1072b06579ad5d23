//! Operation parameter validation: AgentUpgrade's for both install modes (docs/design.md, "The
//! state machine", says what each accepts), the drain's in `drain.rs`.
//!
//! Every rejection is a fixed string: a URL may carry a SAS token in its query or credentials in
//! its userinfo, and parser errors echo their input, so no part of the input ever reaches a
//! message.

use super::agent::InstallMode;
use super::agent::{Arch, ArchiveUrl, ImageRef, Sha256Hex, UpgradeTarget};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub const PARAM_URL: &str = "downloadURL";
pub const PARAM_SHA256: &str = "sha256";

/// Why AgentUpgrade parameters were rejected. Each maps to one fixed message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InvalidParameter {
    MissingUrl,
    MissingDigest,
    MalformedDigest,
    UnparsableUrl,
    UnsupportedScheme,
    MissingHost,
    UrlHasCredentials,
    UrlHasFragment,
    ImageUrlOnHostInstall,
    ArchiveUrlOnContainerInstall,
    InvalidImageReference,
    DigestInImageReference,
    UnsupportedArchitecture,
    DrainNotBoolean,
    DrainTimeoutInvalid,
    DrainOnTimeoutInvalid,
    DrainEmptyDirNotBoolean,
}

impl InvalidParameter {
    pub fn message(self) -> &'static str {
        match self {
            Self::MissingUrl => "missing required parameter downloadURL",
            Self::MissingDigest => "missing required parameter sha256",
            Self::MalformedDigest => "parameter sha256 must be 64 hexadecimal characters",
            Self::UnparsableUrl => "parameter downloadURL is not a valid URL",
            Self::UnsupportedScheme => "parameter downloadURL must use http or https",
            Self::MissingHost => "parameter downloadURL must name a host",
            Self::UrlHasCredentials => "parameter downloadURL must not contain credentials",
            Self::UrlHasFragment => "parameter downloadURL must not contain a fragment",
            Self::ImageUrlOnHostInstall => {
                "parameter downloadURL names an image, but this node runs the host install"
            }
            Self::ArchiveUrlOnContainerInstall => {
                "parameter downloadURL names an archive, but this node runs the container install"
            }
            Self::InvalidImageReference => {
                "parameter downloadURL is not a valid oci:// image reference"
            }
            Self::DigestInImageReference => {
                "parameter downloadURL must not embed a digest; pass it in sha256"
            }
            Self::UnsupportedArchitecture => "this node's CPU architecture has no agent build",
            Self::DrainNotBoolean => "parameter drain must be \"true\" or \"false\"",
            Self::DrainTimeoutInvalid => {
                "parameter drainTimeout must be a duration such as 90s, 10m or 1h30m, at most 24h"
            }
            Self::DrainOnTimeoutInvalid => {
                "parameter drainOnTimeout must be \"Fail\" or \"Proceed\""
            }
            Self::DrainEmptyDirNotBoolean => {
                "parameter drainDeleteEmptyDirData must be \"true\" or \"false\""
            }
        }
    }
}

impl fmt::Display for InvalidParameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// Validates AgentUpgrade parameters for the node's install mode. The digest is checked first
/// (the anchor's order since #370), then the URL.
pub fn validate_upgrade(
    mode: InstallMode,
    arch: Arch,
    params: &BTreeMap<String, String>,
) -> Result<UpgradeTarget, InvalidParameter> {
    let url = params
        .get(PARAM_URL)
        .map(|u| u.trim())
        .filter(|u| !u.is_empty());
    let digest = match params
        .get(PARAM_SHA256)
        .map(|d| d.trim())
        .filter(|d| !d.is_empty())
    {
        None => return Err(InvalidParameter::MissingDigest),
        Some(raw) => Sha256Hex::parse(raw).ok_or(InvalidParameter::MalformedDigest)?,
    };
    let url = url.ok_or(InvalidParameter::MissingUrl)?;
    if arch == Arch::Unsupported {
        return Err(InvalidParameter::UnsupportedArchitecture);
    }
    let is_oci = url
        .get(..6)
        .is_some_and(|s| s.eq_ignore_ascii_case("oci://"));
    match (mode, is_oci) {
        (InstallMode::Host, true) => Err(InvalidParameter::ImageUrlOnHostInstall),
        (InstallMode::Host, false) => Ok(UpgradeTarget::Archive {
            url: parse_archive_url(url)?,
            sha256: digest,
        }),
        (InstallMode::Container, true) => Ok(UpgradeTarget::Image {
            image: parse_oci_url(url)?,
            digest,
        }),
        (InstallMode::Container, false) => Err(InvalidParameter::ArchiveUrlOnContainerInstall),
    }
}

fn parse_archive_url(raw: &str) -> Result<ArchiveUrl, InvalidParameter> {
    let parsed = url::Url::parse(raw).map_err(|_| InvalidParameter::UnparsableUrl)?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(InvalidParameter::UnsupportedScheme);
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(InvalidParameter::UrlHasCredentials);
    }
    if parsed.fragment().is_some() {
        return Err(InvalidParameter::UrlHasFragment);
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(InvalidParameter::MissingHost);
    }
    Ok(ArchiveUrl::validated(parsed.to_string()))
}

/// `oci://registry[:port]/path[:tag]`, as AgentUpgrade and the config (`agentImage`) name images.
pub fn parse_oci_url(url: &str) -> Result<ImageRef, InvalidParameter> {
    parse_image_ref(without_oci_scheme(url).ok_or(InvalidParameter::InvalidImageReference)?)
}

/// What follows `oci://` (any case), if `url` starts with it.
pub fn without_oci_scheme(url: &str) -> Option<&str> {
    url.get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case("oci://"))
        .map(|_| &url[6..])
}

/// Parses `registry[:port]/path[:tag]` following the distribution reference grammar, and
/// requires a registry host so the pull never depends on a default registry.
fn parse_image_ref(raw: &str) -> Result<ImageRef, InvalidParameter> {
    use InvalidParameter::InvalidImageReference as Bad;
    if raw.contains("@sha256:") {
        return Err(InvalidParameter::DigestInImageReference);
    }
    if raw.contains(['@', '?', '#', ' ']) || raw.len() > 255 {
        return Err(Bad);
    }
    let (registry, rest) = raw.split_once('/').ok_or(Bad)?;
    if !(registry.contains(['.', ':']) || registry == "localhost") || !valid_registry(registry) {
        return Err(Bad);
    }
    // A ':' after the last '/' separates the tag.
    let (repository, tag) = match rest.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag)),
        Some(_) | None => (rest, None),
    };
    if repository.is_empty() || !repository.split('/').all(valid_path_component) {
        return Err(Bad);
    }
    if let Some(tag) = tag {
        let mut chars = tag.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if !first_ok
            || tag.len() > 128
            || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        {
            return Err(Bad);
        }
    }
    Ok(ImageRef {
        registry: registry.to_string(),
        repository: repository.to_string(),
        tag: tag.map(str::to_string),
    })
}

fn valid_registry(registry: &str) -> bool {
    let (host, port) = match registry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (registry, None),
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host_ok && port_ok
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*`
fn valid_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    if !alnum(first) || !alnum(last) {
        return false;
    }
    let mut sep = String::new();
    for &b in bytes {
        if alnum(b) {
            if !matches!(sep.as_str(), "" | "." | "_" | "__") && !sep.bytes().all(|s| s == b'-') {
                return false;
            }
            sep.clear();
        } else if matches!(b, b'.' | b'_' | b'-') {
            sep.push(b as char);
        } else {
            return false;
        }
    }
    true
}

/// Why an image the node pulls by digest (`nodeImages`, `sandboxImage`) was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnpinnedImage {
    /// No `@sha256:<64 hex>`: a tag alone could change under the node.
    NoDigest,
    /// The part before the digest is not `REGISTRY/REPOSITORY[:TAG]`.
    NotAReference,
}

/// `REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex>`, the form of every image the node pulls: the
/// one rule for the configuration's images and the kubelet's sandbox image.
pub fn parse_pinned_image(reference: &str) -> Result<(ImageRef, Sha256Hex), UnpinnedImage> {
    let (name, digest) = reference.rsplit_once('@').ok_or(UnpinnedImage::NoDigest)?;
    let digest = digest
        .starts_with("sha256:")
        .then(|| Sha256Hex::parse(digest))
        .flatten()
        .ok_or(UnpinnedImage::NoDigest)?;
    let image = parse_image_ref(name).map_err(|_| UnpinnedImage::NotAReference)?;
    Ok((image, digest))
}

/// A bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}` (the kubelet's first credential).
pub fn valid_bootstrap_token(t: &str) -> bool {
    let lower = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    t.split_once('.')
        .is_some_and(|(id, secret)| lower(id, 6) && lower(secret, 16))
}

/// The `podCIDR` that takes each node's pod range from the cluster: the range the
/// controller-manager allocates in `Node.spec.podCIDR`, which the kubelet hands to the runtime
/// (CRI `UpdateRuntimeConfig`), which renders the bridge network from a template. Until then
/// the node has no pod network (the kubelet reports it not ready); a cluster network that
/// writes its own CNI configuration is used instead and the template never rendered.
pub const POD_RANGE_FROM_CLUSTER: &str = "cluster";

/// A pod range: [`POD_RANGE_FROM_CLUSTER`] or an IPv4 CIDR such as `10.88.0.0/16` (four
/// decimal octets without leading zeros, a prefix of at most 32 bits).
pub fn valid_pod_range(c: &str) -> bool {
    let octet = |o: &str| {
        !o.is_empty()
            && o.len() <= 3
            && o.bytes().all(|b| b.is_ascii_digit())
            && (o == "0" || !o.starts_with('0'))
            && o.parse::<u8>().is_ok()
    };
    c == POD_RANGE_FROM_CLUSTER
        || c.split_once('/').is_some_and(|(ip, bits)| {
            ip.split('.').count() == 4
                && ip.split('.').all(octet)
                && bits.parse::<u8>().is_ok_and(|b| b <= 32)
        })
}

/// `vMAJOR.MINOR.PATCH`, as a Kubernetes version is named (what a node image's tag holds).
pub fn is_kubernetes_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_images_tokens_and_pod_ranges() {
        let hex = "ee6521f290b2168b6e0935a181d4cff9be1ac3f505666ef0e3c98fae8199917a";
        let (image, digest) =
            parse_pinned_image(&format!("r.example:5000/a/pause:3.10@sha256:{hex}"))
                .expect("pinned");
        assert_eq!(
            (image.registry.as_str(), image.repository.as_str()),
            ("r.example:5000", "a/pause")
        );
        assert_eq!(digest.as_str(), hex);
        for (bad, why) in [
            ("r.example/pause:3.10", UnpinnedImage::NoDigest),
            ("r.example/pause@sha256:1234", UnpinnedImage::NoDigest),
            (
                &format!("r.example/pause@{hex}") as &str,
                UnpinnedImage::NoDigest,
            ),
            (
                &format!("pause@sha256:{hex}") as &str,
                UnpinnedImage::NotAReference,
            ),
            (
                &format!("r.example/pau\"se@sha256:{hex}"),
                UnpinnedImage::NotAReference,
            ),
        ] {
            assert_eq!(parse_pinned_image(bad).err(), Some(why), "{bad}");
        }
        assert!(valid_bootstrap_token("abcdef.0123456789abcdef"));
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdefg",
        ] {
            assert!(!valid_bootstrap_token(bad), "{bad}");
        }
        for good in ["cluster", "10.88.0.0/16", "0.0.0.0/0", "255.255.255.255/32"] {
            assert!(valid_pod_range(good), "{good}");
        }
        for bad in [
            "Cluster",
            "10.88.0.0/40",
            "10.88.0/16",
            "10.88.0.256/16",
            "010.0.0.0/8",
            "10.0.0.0",
            "10..0.0/8",
            "a.b.c.d/8",
        ] {
            assert!(!valid_pod_range(bad), "{bad}");
        }
    }
    use proptest::prelude::*;

    const HEX: &str = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592";

    fn params(url: Option<&str>, sha: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        if let Some(u) = url {
            m.insert(PARAM_URL.to_string(), u.to_string());
        }
        if let Some(s) = sha {
            m.insert(PARAM_SHA256.to_string(), s.to_string());
        }
        m
    }

    fn host(url: Option<&str>, sha: Option<&str>) -> Result<UpgradeTarget, InvalidParameter> {
        validate_upgrade(InstallMode::Host, Arch::Amd64, &params(url, sha))
    }

    fn container(url: Option<&str>, sha: Option<&str>) -> Result<UpgradeTarget, InvalidParameter> {
        validate_upgrade(InstallMode::Container, Arch::Amd64, &params(url, sha))
    }

    #[test]
    fn host_install_accepts_https_archive_with_digest() {
        let t = host(
            Some("https://releases.example.net/flexnode.tar.gz?sig=abc"),
            Some(HEX),
        );
        let Ok(UpgradeTarget::Archive { url, sha256 }) = t else {
            panic!("expected archive, got {t:?}");
        };
        assert_eq!(
            url.expose(),
            "https://releases.example.net/flexnode.tar.gz?sig=abc"
        );
        assert_eq!(
            url.to_string(),
            "https://releases.example.net/flexnode.tar.gz?<redacted>"
        );
        assert_eq!(sha256.as_str(), HEX);
        let upper = format!("sha256:{}", HEX.to_uppercase());
        assert!(host(Some("http://127.0.0.1:8080/a.tgz"), Some(&upper)).is_ok());
    }

    #[test]
    fn host_install_rejections() {
        use InvalidParameter as E;
        let u = "https://h.example/a.tgz";
        let table: &[(Option<&str>, Option<&str>, E)] = &[
            (Some(u), None, E::MissingDigest),
            (Some(u), Some("   "), E::MissingDigest),
            (Some(u), Some("abc"), E::MalformedDigest),
            (Some(u), Some(&HEX[1..]), E::MalformedDigest),
            (None, Some(HEX), E::MissingUrl),
            (Some("  "), Some(HEX), E::MissingUrl),
            (None, Some("zz"), E::MalformedDigest), // digest reported first
            (
                Some("oci://r.example/a:1"),
                Some(HEX),
                E::ImageUrlOnHostInstall,
            ),
            (
                Some("ftp://h.example/a.tgz"),
                Some(HEX),
                E::UnsupportedScheme,
            ),
            (
                Some("https://user:pw@h.example/a.tgz"),
                Some(HEX),
                E::UrlHasCredentials,
            ),
            (
                Some("https://user@h.example/a.tgz"),
                Some(HEX),
                E::UrlHasCredentials,
            ),
            (
                Some("https://h.example/a.tgz#frag"),
                Some(HEX),
                E::UrlHasFragment,
            ),
            (Some("not a url"), Some(HEX), E::UnparsableUrl),
            (Some("file:///etc/passwd"), Some(HEX), E::UnsupportedScheme),
        ];
        for (url, sha, want) in table {
            assert_eq!(host(*url, *sha), Err(*want), "url={url:?} sha={sha:?}");
        }
        let arm = validate_upgrade(
            InstallMode::Host,
            Arch::Unsupported,
            &params(Some(u), Some(HEX)),
        );
        assert_eq!(arm, Err(E::UnsupportedArchitecture));
    }

    #[test]
    fn container_install_accepts_oci_reference() {
        let t = container(
            Some("oci://ghcr.io/azure/aks-flex-node-agent:v0.2.1"),
            Some(HEX),
        );
        let Ok(UpgradeTarget::Image { image, digest }) = t else {
            panic!("expected image, got {t:?}");
        };
        assert_eq!(image.registry, "ghcr.io");
        assert_eq!(image.repository, "azure/aks-flex-node-agent");
        assert_eq!(image.tag.as_deref(), Some("v0.2.1"));
        assert_eq!(
            image.pinned(&digest),
            format!("ghcr.io/azure/aks-flex-node-agent@sha256:{HEX}")
        );
        assert!(container(Some("oci://127.0.0.1:5000/flexnode"), Some(HEX)).is_ok());
        assert!(container(Some("oci://localhost:5000/a/b-c/d__e:latest"), Some(HEX)).is_ok());
    }

    #[test]
    fn container_install_rejections() {
        use InvalidParameter as E;
        let table: &[(Option<&str>, Option<&str>, E)] = &[
            (Some("oci://r.example/a"), None, E::MissingDigest),
            (
                Some(&format!("oci://r.example/a@sha256:{HEX}")),
                Some(HEX),
                E::DigestInImageReference,
            ),
            (
                Some("https://h.example/a.tgz"),
                Some(HEX),
                E::ArchiveUrlOnContainerInstall,
            ),
            (
                Some("oci://flexnode:v1"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://library/flexnode"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/UPPER"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://user:pw@r.example/a"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/a?token=x"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/a#f"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/a:"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/a:-bad"),
                Some(HEX),
                E::InvalidImageReference,
            ),
            (
                Some("oci://r.example/a--b..c"),
                Some(HEX),
                E::InvalidImageReference,
            ),
        ];
        for (url, sha, want) in table {
            assert_eq!(container(*url, *sha), Err(*want), "url={url:?}");
        }
    }

    fn secret() -> impl Strategy<Value = String> {
        "[A-Za-z0-9]{12,24}".prop_map(|s| format!("SECRET{s}"))
    }

    proptest! {
        /// Whatever the URL carries in userinfo, query or fragment, neither the result's
        /// message nor any rendering of an accepted target contains it.
        #[test]
        fn no_message_contains_a_url_secret(
            secret in secret(),
            place in 0usize..6,
            scheme in prop::sample::select(vec!["https", "http", "oci", "ftp", "HTTPS"]),
            container_mode in any::<bool>(),
            digest_ok in any::<bool>(),
        ) {
            let url = match place {
                0 => format!("{scheme}://{secret}@host.example/a.tgz"),
                1 => format!("{scheme}://user:{secret}@host.example/a.tgz"),
                2 => format!("{scheme}://host.example/a.tgz?sig={secret}"),
                3 => format!("{scheme}://host.example/a.tgz#{secret}"),
                4 => format!("{scheme}://host.example/repo/{secret}x?{secret}"),
                _ => format!("{scheme}://host.example:5000/a/b:tag?t={secret}&u=1"),
            };
            let sha = if digest_ok { HEX.to_string() } else { format!("{secret}zz") };
            let mode = if container_mode { InstallMode::Container } else { InstallMode::Host };
            match validate_upgrade(mode, Arch::Amd64, &params(Some(&url), Some(&sha))) {
                Err(e) => {
                    prop_assert!(!e.message().contains(&secret));
                    let shown = format!("{e:?} {e}");
                    prop_assert!(!shown.contains(&secret));
                }
                Ok(target) => {
                    // A query is allowed for archives (SAS), but never rendered.
                    let shown = format!("{target} {target:?}");
                    if place == 2 || place == 5 {
                        prop_assert!(!shown.contains(&secret), "{}", shown);
                    }
                    prop_assert!(place != 0 && place != 1 && place != 3);
                }
            }
        }

        #[test]
        fn digest_parser_never_panics_and_round_trips(raw in ".{0,80}") {
            if let Some(d) = Sha256Hex::parse(&raw) {
                prop_assert_eq!(Sha256Hex::parse(&d.oci()), Some(d.clone()));
                prop_assert_eq!(d.as_str().len(), 64);
            }
        }

        #[test]
        fn image_parser_never_panics(raw in "oci://[a-z0-9:./@?#_-]{0,60}") {
            let _ = container(Some(&raw), Some(HEX));
        }
    }
}
