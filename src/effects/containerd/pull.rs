//! The pull itself (see the module docs in `mod.rs` for its five steps): resolve, fetch
//! under a lease, unpack, then the image record.

use super::manifest::{Manifest, config_diff_ids, is_index, media_type_of, pick_platform};
use super::oci_archive::OciArchive;
use super::progress::PullTracker;
use super::registry::{BlobKind, Registry, RegistryRef};
use super::{
    GrpcContainerd, MAX_SMALL_BLOB, PULLED_BY_LABEL, PULLED_BY_VALUE, PulledImage, WRITE_CHUNK,
    chain_ids, grpc_failed, is_agent_pulled, len_i64, parse_json, verify,
};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use containerd_client::services::v1::{
    CreateImageRequest, GetImageRequest, Image, UpdateImageRequest,
};
use containerd_client::tonic::Code;
use containerd_client::types::Descriptor;
use std::collections::HashMap;
use std::path::Path;

/// Whether a pull unpacks the layers into snapshots (what a container runs on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Snapshots {
    Unpack,
    Skip,
}

pub(super) struct SmallBlob {
    bytes: Vec<u8>,
    content_type: Option<String>,
}

impl GrpcContainerd {
    /// Pulls and unpacks `reference` (`registry/repo@sha256:…`, equal to `digest`), returning
    /// what was resolved. See the module docs for the steps.
    pub async fn pull_image(
        &self,
        reference: &str,
        digest: &Sha256Hex,
    ) -> EffectResult<PulledImage> {
        self.pull_with(reference, digest, None, Snapshots::Unpack)
            .await
    }

    /// [`Self::pull_image`] without the snapshots: the content and the record only, what a
    /// machine's tree is unpacked from (`unpack_image_into`). A node image's snapshot would be
    /// a second copy of its tree (and took 111 s of a TCG guest's join).
    /// Blobs in `archive` (when it exists) are read from there, the rest from the registry.
    pub async fn pull_image_content(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        archive: Option<&Path>,
    ) -> EffectResult<PulledImage> {
        self.pull_with(reference, digest, archive, Snapshots::Skip)
            .await
    }

    async fn pull_with(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        archive: Option<&Path>,
        snapshots: Snapshots,
    ) -> EffectResult<PulledImage> {
        let reg = Registry::new(
            RegistryRef::parse(reference, digest)?.repo(),
            &self.registry,
            self.io_timeout,
        )
        .with_archive(OciArchive::at(archive).await?);
        let lease = self.create_lease("pull").await?;
        let result = self.pull_under_lease(&reg, digest, &lease, snapshots).await;
        let released = self.delete_lease(&lease).await;
        let pulled = result?;
        released?;
        Ok(pulled)
    }

    async fn pull_under_lease(
        &self,
        reg: &Registry,
        digest: &Sha256Hex,
        lease: &str,
        snapshots: Snapshots,
    ) -> EffectResult<PulledImage> {
        let image = self.resolve(reg, digest, lease).await?;
        self.store_content(reg, &image, lease).await?;
        if snapshots == Snapshots::Unpack {
            self.unpack(
                &image.manifest.layers,
                &image.diff_ids,
                &image.chain_ids,
                lease,
            )
            .await?;
        }
        // The image record, last.
        let name = reg.rr.at(&digest.oci());
        self.ensure_record(&name, &image.top_desc, lease).await?;
        Ok(PulledImage {
            name,
            target_media_type: image.top_desc.media_type,
            manifest_digest: image.manifest_desc.digest,
            chain_ids: image.chain_ids,
        })
    }

    /// The pinned object, the platform manifest and the config, read from the registry.
    async fn resolve(
        &self,
        reg: &Registry,
        digest: &Sha256Hex,
        lease: &str,
    ) -> EffectResult<Resolved> {
        let top_digest = digest.oci();
        let top = self
            .small_blob(reg, BlobKind::Manifest, &top_digest, None, lease)
            .await?;
        let top_json = parse_json(&top.bytes, "manifest", &top_digest)?;
        let top_type = media_type_of(&top_json, top.content_type.as_deref());
        let top_desc = Descriptor {
            media_type: top_type.clone(),
            digest: top_digest.clone(),
            size: len_i64(top.bytes.len()),
            annotations: HashMap::new(),
        };
        let (index, manifest_desc, manifest_bytes) = if is_index(&top_type) {
            let (pos, desc) = self.pick_platform(&top_json, &top_digest)?;
            let m = self
                .small_blob(
                    reg,
                    BlobKind::Manifest,
                    &desc.digest,
                    Some(desc.size),
                    lease,
                )
                .await?;
            (Some((pos, top.bytes)), desc, m.bytes)
        } else {
            (None, top_desc.clone(), top.bytes)
        };
        let manifest = Manifest::parse(&manifest_bytes, &manifest_desc.digest)?;
        let config_bytes = self
            .small_blob(
                reg,
                BlobKind::Blob,
                &manifest.config.digest,
                Some(manifest.config.size),
                lease,
            )
            .await?
            .bytes;
        let diff_ids = config_diff_ids(&config_bytes, &manifest.config.digest)?;
        if diff_ids.len() != manifest.layers.len() {
            return Err(EffectError::Failed(format!(
                "image {}: the config lists {} layers, the manifest {}",
                reg.origin(),
                diff_ids.len(),
                manifest.layers.len()
            )));
        }
        let chain_ids = chain_ids(&diff_ids);
        Ok(Resolved {
            top_desc,
            index,
            manifest_desc,
            manifest_bytes,
            manifest,
            config_bytes,
            diff_ids,
            chain_ids,
        })
    }

    /// The content store: layers streamed, then config, manifest and index, each with the
    /// gc references that keep what it names.
    async fn store_content(&self, reg: &Registry, image: &Resolved, lease: &str) -> EffectResult {
        let manifest = &image.manifest;
        let mut progress = PullTracker::new(self.progress.0.clone(), &manifest.layers);
        for (layer, diff_id) in manifest.layers.iter().zip(&image.diff_ids) {
            let labels = HashMap::from([("containerd.io/uncompressed".into(), diff_id.clone())]);
            self.ensure_blob(reg, layer, None, labels, lease, Some(&mut progress))
                .await?;
            progress.layer_done(layer);
        }
        let mut config_labels = HashMap::new();
        if let Some(top_chain) = image.chain_ids.last() {
            config_labels.insert(
                format!("containerd.io/gc.ref.snapshot.{}", self.snapshotter),
                top_chain.clone(),
            );
        }
        self.ensure_blob(
            reg,
            &manifest.config,
            Some(&image.config_bytes),
            config_labels,
            lease,
            None,
        )
        .await?;
        let mut manifest_labels = HashMap::from([(
            "containerd.io/gc.ref.content.config".to_string(),
            manifest.config.digest.clone(),
        )]);
        for (i, layer) in manifest.layers.iter().enumerate() {
            manifest_labels.insert(
                format!("containerd.io/gc.ref.content.l.{i}"),
                layer.digest.clone(),
            );
        }
        self.ensure_blob(
            reg,
            &image.manifest_desc,
            Some(&image.manifest_bytes),
            manifest_labels,
            lease,
            None,
        )
        .await?;
        if let Some((pos, index_bytes)) = &image.index {
            let labels = HashMap::from([(
                format!("containerd.io/gc.ref.content.m.{pos}"),
                image.manifest_desc.digest.clone(),
            )]);
            self.ensure_blob(reg, &image.top_desc, Some(index_bytes), labels, lease, None)
                .await?;
        }
        Ok(())
    }

    /// The platform manifest in an index: `(position, descriptor)`, for this client's platform.
    pub(super) fn pick_platform(
        &self,
        index: &serde_json::Value,
        index_digest: &str,
    ) -> EffectResult<(usize, Descriptor)> {
        pick_platform(index, index_digest, &self.os, &self.architecture)
    }

    /// A manifest, index or config: from the content store when present (re-verified), else
    /// from the registry (verified against digest and size).
    async fn small_blob(
        &self,
        reg: &Registry,
        kind: BlobKind,
        digest: &str,
        size: Option<i64>,
        lease: &str,
    ) -> EffectResult<SmallBlob> {
        let what = kind.name();
        if let Some(size) = size
            && !(0..=MAX_SMALL_BLOB).contains(&size)
        {
            return Err(EffectError::Failed(format!(
                "{what} {digest} from {}: size {size} is over the {MAX_SMALL_BLOB}-byte limit",
                reg.origin()
            )));
        }
        if let Some(info) = self.content_info(digest).await? {
            let bytes = self.read_content(digest, info.size, Some(lease)).await?;
            verify(&bytes, digest, size, what, "the content store")?;
            return Ok(SmallBlob {
                bytes,
                content_type: None,
            });
        }
        let mut resp = reg.fetch(kind, digest).await?;
        if let Some(len) = resp.content_length
            && (len > MAX_SMALL_BLOB as u64 || size.is_some_and(|s| len != s as u64))
        {
            return Err(EffectError::Failed(format!(
                "{what} {digest} from {}: registry sent {len} bytes, expected {}",
                reg.origin(),
                size.map_or_else(|| format!("at most {MAX_SMALL_BLOB}"), |s| s.to_string())
            )));
        }
        let mut bytes = Vec::new();
        let limit = size.unwrap_or(MAX_SMALL_BLOB) as usize;
        while let Some(chunk) = resp.body.next_chunk(WRITE_CHUNK).await.map_err(|e| {
            EffectError::Failed(format!("{what} {digest} from {}: {e}", reg.origin()))
        })? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > limit {
                return Err(EffectError::Failed(format!(
                    "{what} {digest} from {}: more than {limit} bytes",
                    reg.origin()
                )));
            }
        }
        verify(&bytes, digest, size, what, &reg.origin())?;
        Ok(SmallBlob {
            bytes,
            content_type: resp.content_type,
        })
    }

    /// Creates the agent's record, or checks the one there. A record of the same name that the
    /// agent did not create is left as it is (never adopted, so never removed by the agent).
    async fn ensure_record(&self, name: &str, target: &Descriptor, lease: &str) -> EffectResult {
        let image = Image {
            name: name.to_string(),
            labels: HashMap::from([(PULLED_BY_LABEL.to_string(), PULLED_BY_VALUE.to_string())]),
            target: Some(target.clone()),
            ..Default::default()
        };
        match self
            .images()
            .create(self.req(
                CreateImageRequest {
                    image: Some(image.clone()),
                    source_date_epoch: None,
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => return Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) => return Err(grpc_failed(&format!("create image {name}"), &s)),
        }
        let existing = self
            .images()
            .get(self.req(
                GetImageRequest {
                    name: name.to_string(),
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed(&format!("get image {name}"), &s))?
            .into_inner()
            .image
            .unwrap_or_default();
        let same_target =
            existing.target.as_ref().map(|t| t.digest.as_str()) == Some(&target.digest);
        if !is_agent_pulled(&existing) {
            if same_target {
                tracing::info!(
                    image = name,
                    "image record exists and was not created by the agent; left as it is"
                );
                return Ok(());
            }
            return Err(EffectError::Failed(format!(
                "image record {name} exists with another target and was not pulled by flexnode; \
                 refusing to change it"
            )));
        }
        if same_target {
            return Ok(());
        }
        self.images()
            .update(self.req(
                UpdateImageRequest {
                    image: Some(image),
                    update_mask: Some(prost_types::FieldMask {
                        paths: vec!["target".into()],
                    }),
                    source_date_epoch: None,
                },
                Some(lease),
            ))
            .await
            .map_err(|s| grpc_failed(&format!("update image {name}"), &s))?;
        Ok(())
    }
}

/// An image as its registry describes it, before any of it is stored.
struct Resolved {
    /// The pinned object (an index or a manifest) and, for an index, this platform's
    /// position in it and its bytes.
    top_desc: Descriptor,
    index: Option<(usize, Vec<u8>)>,
    manifest_desc: Descriptor,
    manifest_bytes: Vec<u8>,
    manifest: Manifest,
    config_bytes: Vec<u8>,
    diff_ids: Vec<String>,
    chain_ids: Vec<String>,
}
