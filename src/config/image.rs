//! The images a configuration names: the container install's agent image and the node
//! images the machines are unpacked from.

use super::{ConfigError, bad};
use crate::lifecycle::agent::{ImageRef, InstallMode, Sha256Hex};
use crate::lifecycle::validate::{
    InvalidParameter, UnpinnedImage, parse_oci_url, parse_pinned_image, without_oci_scheme,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The container install's image, pinned by digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentImage {
    pub image: ImageRef,
    pub digest: Sha256Hex,
    /// An OCI archive holding it, on the node (absolute path).
    pub archive: Option<PathBuf>,
}

impl AgentImage {
    /// `registry/repository@sha256:…`, what a pull by digest and `ctr` take.
    pub fn pinned(&self) -> String {
        self.image.pinned(&self.digest)
    }
}

/// The container install names its image by digest; the host install names none. Messages
/// are fixed: a reference may carry a token in its query, so none is echoed.
pub(super) fn agent_image(
    mode: InstallMode,
    image: Option<&str>,
    digest: Option<&str>,
) -> Result<Option<AgentImage>, ConfigError> {
    if mode == InstallMode::Host {
        return match (image, digest) {
            (None, None) => Ok(None),
            (Some(_), _) => Err(bad("agentImage", ONLY_CONTAINER)),
            (None, Some(_)) => Err(bad("agentImageDigest", ONLY_CONTAINER)),
        };
    }
    let image = image.ok_or_else(|| {
        bad(
            "agentImage",
            "is required for the container install: oci://REGISTRY/REPOSITORY[:TAG]",
        )
    })?;
    let image = parse_oci_url(image.trim()).map_err(|e| {
        bad(
            "agentImage",
            match e {
                InvalidParameter::DigestInImageReference => {
                    "must not embed a digest; put it in agentImageDigest"
                }
                _ => "is not an oci://REGISTRY/REPOSITORY[:TAG] reference",
            },
        )
    })?;
    let digest = digest.ok_or_else(|| {
        bad(
            "agentImageDigest",
            "is required for the container install: the image's sha256:<64 hex> digest",
        )
    })?;
    let digest = Sha256Hex::parse(digest).ok_or_else(|| {
        bad(
            "agentImageDigest",
            "must be sha256:<64 hexadecimal characters>",
        )
    })?;
    Ok(Some(AgentImage {
        image,
        digest,
        archive: None,
    }))
}

pub(super) const ONLY_CONTAINER: &str = "only the container install runs an agent image";

/// A node image: the machines' root tree for one Kubernetes version, pinned by digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeImage {
    pub image: ImageRef,
    pub digest: Sha256Hex,
}

impl NodeImage {
    pub fn pinned(&self) -> String {
        self.image.pinned(&self.digest)
    }
}

/// `nodeImages` values: `oci://REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex>`, a digest required
/// (a tag alone could change under the node). Messages are fixed, as for the agent image.
pub(super) fn node_image(version: &str, value: &str) -> Result<NodeImage, ConfigError> {
    const SHAPE: &str = "oci://REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex>";
    let setting = format!("nodeImages.{version}");
    let reference =
        without_oci_scheme(value.trim()).ok_or_else(|| bad(&setting, format!("is not {SHAPE}")))?;
    let (image, digest) = parse_pinned_image(reference).map_err(|e| {
        bad(
            &setting,
            match e {
                UnpinnedImage::NoDigest => format!("must be pinned by digest: {SHAPE}"),
                UnpinnedImage::NotAReference => format!("is not {SHAPE}"),
            },
        )
    })?;
    Ok(NodeImage { image, digest })
}

/// Where the machines' trees come from: pins by version, which win, and a pattern for any
/// other version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeImages {
    pub pins: BTreeMap<String, NodeImage>,
    pub pattern: Option<NodeImagePattern>,
    /// `nodeImageArchive` as written: an absolute path, [`VERSION_PLACEHOLDER`] naming the
    /// version where it appears.
    pub archive: Option<String>,
}

impl NodeImages {
    /// No node image at all: machines are minimal trees without a kubelet.
    pub fn is_empty(&self) -> bool {
        self.pins.is_empty() && self.pattern.is_none()
    }

    /// Where an offline node keeps `version`'s node image (it may not be there).
    pub fn archive_for(&self, version: &str) -> Option<PathBuf> {
        self.archive
            .as_deref()
            .map(|a| PathBuf::from(a.replace(VERSION_PLACEHOLDER, version)))
    }
}

/// The placeholder a node image pattern names the Kubernetes version with.
pub const VERSION_PLACEHOLDER: &str = "{kubernetesVersion}";

/// `nodeImage`: `oci://REGISTRY/REPOSITORY:TAG`, the tag naming the version with
/// [`VERSION_PLACEHOLDER`]; resolved to a digest when a machine is provisioned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeImagePattern {
    /// Without `oci://`.
    pattern: String,
}

impl NodeImagePattern {
    /// The image of `version` (a `vN.N.N`: `validate::is_kubernetes_version`); `None` if the
    /// tag it makes is not one.
    pub fn for_version(&self, version: &str) -> Option<ImageRef> {
        parse_oci_url(&format!(
            "oci://{}",
            self.pattern.replace(VERSION_PLACEHOLDER, version)
        ))
        .ok()
    }

    /// As written, with `oci://`.
    pub fn shown(&self) -> String {
        format!("oci://{}", self.pattern)
    }

    /// The pattern checked by what it makes of a version: an image reference whose tag, and
    /// only its tag, holds the placeholder.
    pub fn parse(value: &str) -> Result<Self, ConfigError> {
        const SHAPE: &str = "oci://REGISTRY/REPOSITORY:TAG with {kubernetesVersion} in the \
                             tag, e.g. oci://registry.example/flexnode/node:{kubernetesVersion}";
        let refuse = || bad("nodeImage", format!("is not {SHAPE}"));
        let pattern = without_oci_scheme(value.trim()).ok_or_else(refuse)?;
        let (name, tag) = pattern.rsplit_once(':').ok_or_else(refuse)?;
        if !tag.contains(VERSION_PLACEHOLDER) || name.contains('{') {
            return Err(refuse());
        }
        let parsed = Self {
            pattern: pattern.to_string(),
        };
        match parsed.for_version("v1.34.12") {
            Some(image) if image.tag.is_some() => Ok(parsed),
            Some(_) | None => Err(refuse()),
        }
    }
}
