//! Manifests, indexes and image configs: what a pull resolves before it writes anything.
//! Public for the fuzz targets (`fuzz/`): every byte here comes from a registry.

use super::{
    MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST, parse_json,
};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use containerd_client::types::Descriptor;
use std::collections::HashMap;

/// The media type names an index (OCI) or a manifest list (Docker).
pub fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

/// The `mediaType` field, else the registry's Content-Type, else guessed from the shape.
pub fn media_type_of(json: &serde_json::Value, content_type: Option<&str>) -> String {
    if let Some(mt) = json.get("mediaType").and_then(|v| v.as_str()) {
        return mt.to_string();
    }
    if let Some(ct) = content_type {
        let ct = ct.split(';').next().unwrap_or_default().trim();
        if [
            MEDIA_OCI_INDEX,
            MEDIA_OCI_MANIFEST,
            MEDIA_DOCKER_LIST,
            MEDIA_DOCKER_MANIFEST,
        ]
        .contains(&ct)
        {
            return ct.to_string();
        }
    }
    if json.get("manifests").is_some() {
        MEDIA_OCI_INDEX.into()
    } else {
        MEDIA_OCI_MANIFEST.into()
    }
}

/// A descriptor as a pull may use it: a `sha256:<64 lowercase hex>` digest, a size, no
/// foreign `urls`. `what` and `parent` name it in the message.
pub fn descriptor(v: &serde_json::Value, what: &str, parent: &str) -> EffectResult<Descriptor> {
    let bad = |why: &str| EffectError::Failed(format!("{parent}: {what}: {why}"));
    let digest = v
        .get("digest")
        .and_then(|d| d.as_str())
        .ok_or_else(|| bad("no digest"))?;
    if Sha256Hex::parse(digest).map(|d| d.oci()).as_deref() != Some(digest) {
        return Err(bad("digest is not sha256:<64 lowercase hex>"));
    }
    let size = v
        .get("size")
        .and_then(serde_json::Value::as_i64)
        .filter(|s| *s >= 0)
        .ok_or_else(|| bad("no valid size"))?;
    if v.get("urls")
        .and_then(|u| u.as_array())
        .is_some_and(|u| !u.is_empty())
    {
        return Err(bad("foreign layers (urls) are not supported"));
    }
    Ok(Descriptor {
        media_type: v
            .get("mediaType")
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_string(),
        digest: digest.to_string(),
        size,
        annotations: HashMap::new(),
    })
}

/// An image manifest's config and layers (at least one).
pub struct Manifest {
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

impl Manifest {
    /// A schemaVersion 2 image manifest (`digest` names it in messages); never an index.
    pub fn parse(bytes: &[u8], digest: &str) -> EffectResult<Self> {
        let v = parse_json(bytes, "manifest", digest)?;
        if v.get("schemaVersion").and_then(serde_json::Value::as_i64) != Some(2) {
            return Err(EffectError::Failed(format!(
                "manifest {digest}: only schemaVersion 2 manifests are supported"
            )));
        }
        let mt = media_type_of(&v, None);
        if is_index(&mt) {
            return Err(EffectError::Failed(format!(
                "manifest {digest}: nested indexes are not supported"
            )));
        }
        let config = descriptor(
            v.get("config").unwrap_or(&serde_json::Value::Null),
            "config",
            digest,
        )?;
        let layers = v
            .get("layers")
            .and_then(|l| l.as_array())
            .ok_or_else(|| EffectError::Failed(format!("manifest {digest} has no layers")))?
            .iter()
            .map(|l| descriptor(l, "layer", digest))
            .collect::<EffectResult<Vec<_>>>()?;
        if layers.is_empty() {
            return Err(EffectError::Failed(format!(
                "manifest {digest} has no layers"
            )));
        }
        Ok(Self { config, layers })
    }
}

/// The image config's `rootfs.diff_ids`, each as `sha256:<64 lowercase hex>`.
pub fn config_diff_ids(bytes: &[u8], digest: &str) -> EffectResult<Vec<String>> {
    let v = parse_json(bytes, "config", digest)?;
    let ids = v
        .get("rootfs")
        .and_then(|r| r.get("diff_ids"))
        .and_then(|d| d.as_array())
        .ok_or_else(|| EffectError::Failed(format!("config {digest} has no rootfs.diff_ids")))?;
    ids.iter()
        .map(|d| {
            d.as_str()
                .and_then(Sha256Hex::parse)
                .map(|h| h.oci())
                .ok_or_else(|| {
                    EffectError::Failed(format!("config {digest}: a diffID is not a sha256 digest"))
                })
        })
        .collect()
}

/// The manifest for `os`/`architecture` in an index: `(position, descriptor)`, the first that
/// matches; a nested index is refused.
pub fn pick_platform(
    index: &serde_json::Value,
    index_digest: &str,
    os: &str,
    architecture: &str,
) -> EffectResult<(usize, Descriptor)> {
    let manifests = index
        .get("manifests")
        .and_then(|m| m.as_array())
        .ok_or_else(|| EffectError::Failed(format!("index {index_digest} has no manifests")))?;
    for (pos, m) in manifests.iter().enumerate() {
        let platform = m.get("platform");
        let field = |k: &str| {
            platform
                .and_then(|p| p.get(k))
                .and_then(|v| v.as_str())
                .unwrap_or_default()
        };
        if field("os") == os && field("architecture") == architecture {
            let desc = descriptor(m, "index entry", index_digest)?;
            if is_index(&desc.media_type) {
                return Err(EffectError::Failed(format!(
                    "index {index_digest}: nested indexes are not supported"
                )));
            }
            return Ok((pos, desc));
        }
    }
    Err(EffectError::Failed(format!(
        "index {index_digest} has no {os}/{architecture} manifest"
    )))
}
