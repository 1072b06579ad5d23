//! containerd over gRPC: the production [`Containerd`] implementation.
//!
//! Works with containerd 1.6 (Debian 12), which has no Transfer service, and 2.x alike: the
//! pull is done here (`pull.rs`), as `ctr pull` does it in Go, with the registry reached
//! through oci-client (`registry.rs`):
//!
//! 1. resolve the pinned manifest from the registry by digest (an index is narrowed to the
//!    configured platform, linux/amd64 by default) and fetch the config; every byte is checked
//!    against its sha256 and declared size before anything is committed;
//! 2. under a lease (`containerd-lease` metadata, with a `containerd.io/gc.expire` label so a
//!    crashed pull is collected eventually), stream each blob from the registry into the
//!    content store (`Content.Write` with the expected digest, which containerd re-verifies at
//!    commit), labelled with the `containerd.io/gc.ref.*` references that keep the image's
//!    content and snapshots alive after the lease is gone;
//! 3. unpack through the snapshotter: per layer, `Snapshots.Prepare` on the parent chainID,
//!    `Diff.Apply`, `Snapshots.Commit` as the chainID (`sha256(parent + " " + diffID)`); the
//!    applied (uncompressed) digest must equal the config's diffID;
//! 4. create the image record `<registry>/<repo>@sha256:<digest>` labelled
//!    [`PULLED_BY_LABEL`]`=flexnode` — last, so a record means a complete, unpacked image;
//! 5. delete the lease (synchronously, so garbage collection runs with the final references).
//!
//! Every step checks first what is already there, so a pull after a crash only finishes what is
//! missing (`pull.rs`, with the content store in `content.rs` and unpacking in `unpack.rs`).
//! Containers (`container.rs`, `spec.rs`): created, started, stopped and deleted as
//! inherent methods, only ever the ones labelled [`MANAGED_LABEL`].

mod check;
mod container;
mod content;
mod fetched;
mod lazy;
pub mod manifest;
mod oci_archive;
pub use oci_archive::OciArchive;
mod progress;
mod pull;
pub mod registry;
mod rootfs;
mod spec;
mod unpack;

pub use check::{AGENT_BINARY, DEFAULT_CHECK_DIR, DEFAULT_CHECK_TIMEOUT};
pub use container::{StopOutcome, TaskIo, TaskState};
pub use lazy::LazyContainerd;
pub use progress::{Heartbeat, PROGRESS_EVERY, ProgressFn, PullProgress};
pub use registry::{RegistryConfig, basic_credentials};
pub use rootfs::{Compression, apply_layer};
pub use spec::{BindMount, MANAGED_LABEL, MANAGED_VALUE, RUNC_RUNTIME, SPEC_TYPE_URL};

use super::host::agent_image_ref;
use super::{Containerd, EffectError, EffectResult};
use crate::lifecycle::agent::{ImageRef, Sha256Hex};
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::{
    CreateImageRequest, DeleteImageRequest, Image, ListImagesRequest,
    content_client::ContentClient, images_client::ImagesClient,
};
use containerd_client::tonic::{Code, Request, Status, transport::Channel};
use progress::{HeartbeatSink, ProgressSink, log_progress};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The label that marks an image record as pulled by the agent (the only ones it removes).
pub const PULLED_BY_LABEL: &str = "flexnode.io/pulled-by";
pub const PULLED_BY_VALUE: &str = "flexnode";
/// The containerd namespace the agent works in unless told otherwise.
pub const DEFAULT_NAMESPACE: &str = "flexnode";
pub const DEFAULT_SNAPSHOTTER: &str = "overlayfs";

pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Manifests, indexes and configs are read into memory; anything larger is refused.
pub(super) const MAX_SMALL_BLOB: i64 = 4 << 20;
/// Largest single layer accepted.
pub(super) const MAX_LAYER: i64 = 16 << 30;
/// Bytes per `Content.Write` message (containerd accepts up to 16 MiB per message).
pub(super) const WRITE_CHUNK: usize = 1 << 20;
/// A crashed pull's lease is collected after this long.
pub(super) const LEASE_EXPIRY_SECS: i64 = 24 * 3600;

pub(super) const NS_HEADER: &str = "containerd-namespace";
pub(super) const LEASE_HEADER: &str = "containerd-lease";

/// How long one registry or containerd request may take, unless told otherwise.
pub(super) const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// The production [`Containerd`]: one containerd reached over its gRPC socket.
#[derive(Clone, Debug)]
pub struct GrpcContainerd {
    channel: Channel,
    namespace: String,
    snapshotter: String,
    os: String,
    architecture: String,
    /// Connect and per-read timeout towards registries.
    io_timeout: Duration,
    /// Where pull progress goes ([`PullProgress`] as `tracing` events unless
    /// [`Self::with_progress`]).
    progress: ProgressSink,
    /// Called per chunk of a layer streamed or unpacked ([`Self::with_heartbeat`]).
    heartbeat: HeartbeatSink,
    /// How registries are reached (trust, credentials).
    registry: RegistryConfig,
    /// The candidate check's output directory and time limit ([`Self::with_check`]).
    check_dir: PathBuf,
    check_timeout: Duration,
}

/// What a pull resolved, for callers that need more than success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PulledImage {
    /// The image record's name (`registry/repo@sha256:…`).
    pub name: String,
    /// The pinned descriptor (the index when the digest names one).
    pub target_media_type: String,
    /// The platform manifest that was unpacked.
    pub manifest_digest: String,
    /// chainIDs of the layers, bottom to top; the last is the rootfs parent for containers.
    pub chain_ids: Vec<String>,
}

/// An image record holding a given digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    pub name: String,
    pub agent_pulled: bool,
}

impl GrpcContainerd {
    /// Connects to containerd's socket; `namespace` scopes everything the agent does.
    pub async fn connect(socket: impl AsRef<Path>, namespace: &str) -> EffectResult<Self> {
        let socket = socket.as_ref();
        if namespace.is_empty()
            || !namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(EffectError::Failed(format!(
                "invalid containerd namespace {namespace:?}"
            )));
        }
        let channel = containerd_client::connect(socket).await.map_err(|e| {
            EffectError::Failed(format!("containerd: connect to {}: {e}", socket.display()))
        })?;
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "arm" => "arm",
            "s390x" => "s390x",
            "powerpc64" => "ppc64le",
            "riscv64" => "riscv64",
            other => other,
        };
        Ok(Self {
            channel,
            namespace: namespace.to_string(),
            snapshotter: DEFAULT_SNAPSHOTTER.to_string(),
            os: "linux".into(),
            architecture: architecture.into(),
            io_timeout: IO_TIMEOUT,
            progress: ProgressSink(log_progress()),
            heartbeat: HeartbeatSink(None),
            registry: RegistryConfig::default(),
            check_dir: PathBuf::from(DEFAULT_CHECK_DIR),
            check_timeout: DEFAULT_CHECK_TIMEOUT,
        })
    }

    /// Unpacks into this snapshotter (`overlayfs` by default; `native` works everywhere).
    pub fn with_snapshotter(mut self, snapshotter: &str) -> Self {
        self.snapshotter = snapshotter.to_string();
        self
    }

    /// The platform picked from an index (`linux`/host architecture by default).
    pub fn with_platform(mut self, os: &str, architecture: &str) -> Self {
        self.os = os.to_string();
        self.architecture = architecture.to_string();
        self
    }

    /// Sends pull progress ([`PullProgress`]) to `progress` instead of `tracing::info!` events.
    pub fn with_progress(mut self, progress: ProgressFn) -> Self {
        self.progress = ProgressSink(progress);
        self
    }

    /// Calls `heartbeat` per chunk of a layer streamed into the content store or unpacked
    /// into a tree: a sign of life during one long effect.
    pub fn with_heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.heartbeat = HeartbeatSink(Some(heartbeat));
        self
    }

    /// What TLS trusts and where registry credentials come from.
    pub fn with_registry(mut self, registry: RegistryConfig) -> Self {
        self.registry = registry;
        self
    }

    pub fn with_io_timeout(mut self, timeout: Duration) -> Self {
        self.io_timeout = timeout;
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn snapshotter(&self) -> &str {
        &self.snapshotter
    }

    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub(super) fn req<T>(&self, msg: T, lease: Option<&str>) -> Request<T> {
        let mut req = Request::new(msg);
        let md = req.metadata_mut();
        // Both values are validated ASCII (namespace at connect, lease ids are generated).
        if let Ok(v) = self.namespace.parse() {
            md.insert(NS_HEADER, v);
        }
        if let Some(lease) = lease
            && let Ok(v) = lease.parse()
        {
            md.insert(LEASE_HEADER, v);
        }
        req
    }

    pub(super) fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone())
            .max_decoding_message_size(32 << 20)
            .max_encoding_message_size(32 << 20)
    }

    pub(super) fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel.clone())
    }

    pub(super) fn snapshots(&self) -> SnapshotsClient<Channel> {
        SnapshotsClient::new(self.channel.clone())
    }

    /// Every image record whose target is `digest`, and whether the agent pulled it.
    pub async fn image_records(&self, digest: &Sha256Hex) -> EffectResult<Vec<ImageRecord>> {
        Ok(self
            .images_of(digest)
            .await?
            .into_iter()
            .map(|i| ImageRecord {
                agent_pulled: is_agent_pulled(&i),
                name: i.name,
            })
            .collect())
    }

    async fn images_of(&self, digest: &Sha256Hex) -> EffectResult<Vec<Image>> {
        let filter = format!("target.digest==\"{}\"", digest.oci());
        let list = self
            .images()
            .list(self.req(
                ListImagesRequest {
                    filters: vec![filter],
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("list images", &s))?
            .into_inner();
        Ok(list
            .images
            .into_iter()
            .filter(|i| i.target.as_ref().map(|t| t.digest.as_str()) == Some(&digest.oci()))
            .collect())
    }
}

impl Containerd for GrpcContainerd {
    async fn pull(&self, reference: &str, digest: &Sha256Hex) -> EffectResult {
        let pulled = self.pull_image(reference, digest).await?;
        tracing::info!(
            image = %pulled.name,
            manifest = %pulled.manifest_digest,
            layers = pulled.chain_ids.len(),
            "image pulled and unpacked"
        );
        Ok(())
    }

    /// An image record the agent pulled whose target is `digest` exists.
    async fn image_present(&self, digest: &Sha256Hex) -> EffectResult<bool> {
        Ok(self
            .image_records(digest)
            .await?
            .iter()
            .any(|r| r.agent_pulled))
    }

    /// Deletes the agent's records of `digest` (content and snapshots follow by garbage
    /// collection, unless something else still uses them). None at all: nothing to do. Only
    /// records the agent did not pull: refused.
    async fn check_image(&self, digest: &Sha256Hex) -> EffectResult<String> {
        GrpcContainerd::check_image(self, digest).await
    }

    async fn resolve_tag(
        &self,
        image: &ImageRef,
        archive: Option<&Path>,
    ) -> EffectResult<Sha256Hex> {
        registry::resolve_tag(image, archive, &self.registry, self.io_timeout).await
    }

    async fn pull_content(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        archive: Option<&Path>,
    ) -> EffectResult {
        let pulled = self.pull_image_content(reference, digest, archive).await?;
        tracing::info!(image = %pulled.name, manifest = %pulled.manifest_digest, "image pulled");
        Ok(())
    }

    async fn unpack_image_into(&self, digest: &Sha256Hex, dir: &Path) -> EffectResult {
        GrpcContainerd::unpack_image_into(self, digest, dir).await
    }

    /// A record named `AGENT_IMAGE_NAME@digest` beside the one it came by, labelled as pulled
    /// by the agent only when that one is.
    async fn name_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        let name = agent_image_ref(digest);
        let records = self.images_of(digest).await?;
        if records.iter().any(|i| i.name == name) {
            return Ok(());
        }
        let source = records
            .iter()
            .find(|i| is_agent_pulled(i))
            .or(records.first())
            .ok_or_else(|| {
                EffectError::Failed(format!(
                    "image {} is not in containerd (namespace {})",
                    digest.oci(),
                    self.namespace
                ))
            })?;
        let labels = if is_agent_pulled(source) {
            HashMap::from([(PULLED_BY_LABEL.to_string(), PULLED_BY_VALUE.to_string())])
        } else {
            HashMap::new()
        };
        let image = Image {
            name: name.clone(),
            labels,
            target: source.target.clone(),
            ..Default::default()
        };
        match self
            .images()
            .create(self.req(
                CreateImageRequest {
                    image: Some(image),
                    source_date_epoch: None,
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => Ok(()),
            Err(s) => Err(grpc_failed(&format!("create image {name}"), &s)),
        }
    }

    async fn remove_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        let records = self.image_records(digest).await?;
        let (ours, theirs): (Vec<_>, Vec<_>) = records.into_iter().partition(|r| r.agent_pulled);
        if ours.is_empty() {
            if let Some(other) = theirs.first() {
                return Err(EffectError::Failed(format!(
                    "image {other} ({}) was not pulled by flexnode (no {PULLED_BY_LABEL} label); \
                     refusing to remove it",
                    digest.oci(),
                    other = other.name
                )));
            }
            return Ok(());
        }
        for record in ours {
            match self
                .images()
                .delete(self.req(
                    DeleteImageRequest {
                        name: record.name.clone(),
                        sync: true,
                        target: None,
                    },
                    None,
                ))
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == Code::NotFound => {}
                Err(s) => {
                    return Err(grpc_failed(&format!("delete image {}", record.name), &s));
                }
            }
        }
        Ok(())
    }
}

pub(super) fn is_agent_pulled(image: &Image) -> bool {
    image.labels.get(PULLED_BY_LABEL).map(String::as_str) == Some(PULLED_BY_VALUE)
}

pub(super) fn grpc_failed(what: &str, status: &Status) -> EffectError {
    EffectError::Failed(format!(
        "containerd: {what}: {} ({:?})",
        status.message(),
        status.code()
    ))
}

pub(super) fn len_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// chainIDs from diffIDs, as containerd computes them (`identity.ChainIDs`).
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        let next = match out.last() {
            None => diff_id.clone(),
            Some(parent) => format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{parent} {diff_id}").as_bytes()))
            ),
        };
        out.push(next);
    }
    out
}

pub(super) fn verify(
    bytes: &[u8],
    digest: &str,
    size: Option<i64>,
    what: &str,
    from: &str,
) -> EffectResult {
    let got = format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
    if got != digest {
        return Err(EffectError::Failed(format!(
            "{what} {digest} from {from}: sha256 verification failed (the data hashes to {got})"
        )));
    }
    if let Some(size) = size
        && len_i64(bytes.len()) != size
    {
        return Err(EffectError::Failed(format!(
            "{what} {digest} from {from}: {} bytes, the descriptor says {size}",
            bytes.len()
        )));
    }
    Ok(())
}

pub(super) fn parse_json(
    bytes: &[u8],
    what: &str,
    digest: &str,
) -> EffectResult<serde_json::Value> {
    serde_json::from_slice(bytes)
        .map_err(|e| EffectError::Failed(format!("{what} {digest} is not valid JSON: {e}")))
}
