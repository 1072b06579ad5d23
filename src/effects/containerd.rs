//! containerd over gRPC: the production [`Containerd`] implementation.
//!
//! Works with containerd 1.6 (Debian 12), which has no Transfer service, so the pull is done
//! here, as `ctr pull` does it in Go:
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
//! missing. Registries: plain HTTP for loopback registries only (`127.0.0.0/8`, `::1`,
//! `localhost`); every other registry needs HTTPS, which is not implemented yet (no TLS client in
//! the dependency set) and fails with a clear error. No credentials are supported: a registry
//! that asks for them fails the pull, and no message ever contains a credential.
//!
//! Containers (inherent methods, not part of the [`Containerd`] trait): `create_container`
//! prepares a new active snapshot (key = container id) on the image's top chainID and creates
//! a container record with a hand-built OCI runtime spec (runc v2), both under a short lease and
//! labelled [`MANAGED_LABEL`]; `start_container` is `Tasks.Create` (rootfs = the snapshot's
//! mounts, stdio to files via `file://` URIs or to /dev/null) + `Tasks.Start`;
//! `stop_container` is SIGTERM, up to a grace period, SIGKILL to all, `Tasks.Delete`;
//! `delete_container` removes the record and the snapshot, only for managed containers.

use super::{Containerd, EffectError, EffectResult};
use crate::machine::Timestamp;
use crate::machine::validate::Sha256Hex;
use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, MountsRequest, PrepareSnapshotRequest, RemoveSnapshotRequest,
    StatSnapshotRequest,
};
use containerd_client::services::v1::{
    AbortRequest, ApplyRequest, CreateImageRequest, CreateRequest as CreateLeaseRequest,
    DeleteImageRequest, DeleteRequest as DeleteLeaseRequest, GetImageRequest, Image,
    Info as ContentInfo, InfoRequest, ListImagesRequest, ReadContentRequest, UpdateImageRequest,
    UpdateRequest as UpdateContentRequest, WriteAction, WriteContentRequest,
    content_client::ContentClient, diff_client::DiffClient, images_client::ImagesClient,
    leases_client::LeasesClient,
};
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetContainerRequest, GetRequest, KillRequest, ListContainersRequest,
    StartRequest, WaitRequest, containers_client::ContainersClient, tasks_client::TasksClient,
};
use containerd_client::tonic::{Code, Request, Status, transport::Channel};
use containerd_client::types::v1::Status as TaskStatus;
use containerd_client::types::{Descriptor, Mount};
use futures::SinkExt;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

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
const MAX_SMALL_BLOB: i64 = 4 << 20;
/// Largest single layer accepted.
const MAX_LAYER: i64 = 16 << 30;
/// Bytes per `Content.Write` message (containerd accepts up to 16 MiB per message).
const WRITE_CHUNK: usize = 1 << 20;
const MAX_REDIRECTS: usize = 5;
const MAX_HEADER_BYTES: usize = 64 << 10;
/// A crashed pull's lease is collected after this long.
const LEASE_EXPIRY_SECS: i64 = 24 * 3600;

const NS_HEADER: &str = "containerd-namespace";
const LEASE_HEADER: &str = "containerd-lease";

/// Progress of a pull's layer downloads (into the content store), reported to the
/// [`GrpcContainerd::with_progress`] callback: after every ~1 MiB of a layer
/// ([`PROGRESS_EVERY`]) and once per layer when it is in the content store (also for layers
/// that were there already). Counts are over all the layers of the platform manifest, so
/// `bytes_done` and `layers_done` never decrease during one pull and the last report of a
/// successful pull has `bytes_done == bytes_total` and `layers_done == layers_total`.
/// Config, manifest and index (small, fetched first) are not counted. Holds no reference,
/// registry address or URL: nothing that could carry a credential or a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullProgress {
    /// The layer the report is about (`sha256:…`, from the verified manifest).
    pub layer_digest: String,
    /// Bytes of all layers in the content store or streamed into it so far.
    pub bytes_done: u64,
    /// Sum of the layer sizes the manifest declares.
    pub bytes_total: u64,
    /// Layers complete in the content store.
    pub layers_done: usize,
    pub layers_total: usize,
}

/// A pull-progress callback; called on the pulling task, so it should be quick.
pub type ProgressFn = Arc<dyn Fn(PullProgress) + Send + Sync>;

/// Bytes of a layer between two progress reports.
pub const PROGRESS_EVERY: u64 = 1 << 20;

/// The default progress callback: a `tracing::info!` event per report.
fn log_progress(p: PullProgress) {
    tracing::info!(
        layer = %p.layer_digest,
        bytes_done = p.bytes_done,
        bytes_total = p.bytes_total,
        layers_done = p.layers_done,
        layers_total = p.layers_total,
        "pull progress"
    );
}

#[derive(Clone)]
struct ProgressSink(ProgressFn);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// Running totals of one pull's layer downloads.
struct PullTracker {
    sink: ProgressFn,
    bytes_done: u64,
    bytes_total: u64,
    layers_done: usize,
    layers_total: usize,
    /// `bytes_done` when the current layer started.
    layer_base: u64,
    /// `bytes_done` at the last report.
    reported: u64,
}

impl PullTracker {
    fn new(sink: ProgressFn, layers: &[Descriptor]) -> Self {
        Self {
            sink,
            bytes_done: 0,
            bytes_total: layers
                .iter()
                .map(|l| u64::try_from(l.size).unwrap_or(0))
                .sum(),
            layers_done: 0,
            layers_total: layers.len(),
            layer_base: 0,
            reported: 0,
        }
    }

    fn report(&mut self, layer: &str) {
        self.reported = self.bytes_done;
        (self.sink)(PullProgress {
            layer_digest: layer.to_string(),
            bytes_done: self.bytes_done,
            bytes_total: self.bytes_total,
            layers_done: self.layers_done,
            layers_total: self.layers_total,
        });
    }

    /// `n` more bytes of `layer` were sent to the content store.
    fn bytes(&mut self, layer: &str, n: usize) {
        self.bytes_done += n as u64;
        if self.bytes_done - self.reported >= PROGRESS_EVERY {
            self.report(layer);
        }
    }

    /// `layer` is in the content store (streamed now or found there).
    fn layer_done(&mut self, layer: &Descriptor) {
        self.layer_base += u64::try_from(layer.size).unwrap_or(0);
        self.bytes_done = self.layer_base;
        self.layers_done += 1;
        self.report(&layer.digest);
    }
}

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
    /// Where pull progress goes ([`log_progress`] unless [`Self::with_progress`]).
    progress: ProgressSink,
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
            io_timeout: Duration::from_secs(60),
            progress: ProgressSink(Arc::new(log_progress)),
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

    fn req<T>(&self, msg: T, lease: Option<&str>) -> Request<T> {
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

    fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.channel.clone())
            .max_decoding_message_size(32 << 20)
            .max_encoding_message_size(32 << 20)
    }

    fn images(&self) -> ImagesClient<Channel> {
        ImagesClient::new(self.channel.clone())
    }

    fn snapshots(&self) -> SnapshotsClient<Channel> {
        SnapshotsClient::new(self.channel.clone())
    }

    /// Every image record whose target is `digest`, and whether the agent pulled it.
    pub async fn image_records(&self, digest: &Sha256Hex) -> EffectResult<Vec<ImageRecord>> {
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
            .map(|i| ImageRecord {
                agent_pulled: is_agent_pulled(&i),
                name: i.name,
            })
            .collect())
    }

    /// Pulls and unpacks `reference` (`registry/repo@sha256:…`, equal to `digest`), returning
    /// what was resolved. See the module docs for the steps.
    pub async fn pull_image(
        &self,
        reference: &str,
        digest: &Sha256Hex,
    ) -> EffectResult<PulledImage> {
        let reg = RegistryRef::parse(reference, digest, self.io_timeout)?;
        let lease = self.create_lease("pull").await?;
        let result = self.pull_under_lease(&reg, digest, &lease).await;
        let released = self.delete_lease(&lease).await;
        let pulled = result?;
        released?;
        Ok(pulled)
    }

    async fn create_lease(&self, purpose: &str) -> EffectResult<String> {
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|e| EffectError::Failed(format!("random: {e}")))?;
        let id = format!("flexnode-{purpose}-{}", hex::encode(suffix));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let expire = Timestamp::from_millis(now).plus_secs(LEASE_EXPIRY_SECS);
        let labels = HashMap::from([("containerd.io/gc.expire".to_string(), expire.rfc3339())]);
        LeasesClient::new(self.channel.clone())
            .create(self.req(
                CreateLeaseRequest {
                    id: id.clone(),
                    labels,
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("create lease", &s))?;
        Ok(id)
    }

    async fn delete_lease(&self, id: &str) -> EffectResult {
        match LeasesClient::new(self.channel.clone())
            .delete(self.req(
                DeleteLeaseRequest {
                    id: id.to_string(),
                    sync: true,
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed("delete lease", &s)),
        }
    }

    async fn pull_under_lease(
        &self,
        reg: &RegistryRef,
        digest: &Sha256Hex,
        lease: &str,
    ) -> EffectResult<PulledImage> {
        // 1. Resolve: the pinned object, the platform manifest, the config.
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
                reg.display(),
                diff_ids.len(),
                manifest.layers.len()
            )));
        }
        let chain_ids = chain_ids(&diff_ids);

        // 2. Content: layers streamed, then config, manifest, index with their gc references.
        let mut progress = PullTracker::new(self.progress.0.clone(), &manifest.layers);
        for (layer, diff_id) in manifest.layers.iter().zip(&diff_ids) {
            let labels = HashMap::from([("containerd.io/uncompressed".into(), diff_id.clone())]);
            self.ensure_blob(reg, layer, None, labels, lease, Some(&mut progress))
                .await?;
            progress.layer_done(layer);
        }
        let mut config_labels = HashMap::new();
        if let Some(top_chain) = chain_ids.last() {
            config_labels.insert(
                format!("containerd.io/gc.ref.snapshot.{}", self.snapshotter),
                top_chain.clone(),
            );
        }
        self.ensure_blob(
            reg,
            &manifest.config,
            Some(&config_bytes),
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
            &manifest_desc,
            Some(&manifest_bytes),
            manifest_labels,
            lease,
            None,
        )
        .await?;
        if let Some((pos, index_bytes)) = &index {
            let labels = HashMap::from([(
                format!("containerd.io/gc.ref.content.m.{pos}"),
                manifest_desc.digest.clone(),
            )]);
            self.ensure_blob(reg, &top_desc, Some(index_bytes), labels, lease, None)
                .await?;
        }

        // 3. Unpack.
        self.unpack(&manifest.layers, &diff_ids, &chain_ids, lease)
            .await?;

        // 4. The image record, last.
        let name = reg.pinned();
        self.ensure_record(&name, &top_desc, lease).await?;
        Ok(PulledImage {
            name,
            target_media_type: top_type,
            manifest_digest: manifest_desc.digest,
            chain_ids,
        })
    }

    /// The platform manifest in an index: `(position, descriptor)`.
    fn pick_platform(
        &self,
        index: &serde_json::Value,
        index_digest: &str,
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
            if field("os") == self.os && field("architecture") == self.architecture {
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
            "index {index_digest} has no {}/{} manifest",
            self.os, self.architecture
        )))
    }

    /// A manifest, index or config: from the content store when present (re-verified), else
    /// from the registry (verified against digest and size).
    async fn small_blob(
        &self,
        reg: &RegistryRef,
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
                reg.display()
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
                reg.display(),
                size.map_or_else(|| format!("at most {MAX_SMALL_BLOB}"), |s| s.to_string())
            )));
        }
        let mut bytes = Vec::new();
        let limit = size.unwrap_or(MAX_SMALL_BLOB) as usize;
        while let Some(chunk) = resp.body.next_chunk(WRITE_CHUNK).await.map_err(|e| {
            EffectError::Failed(format!("{what} {digest} from {}: {e}", reg.display()))
        })? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() > limit {
                return Err(EffectError::Failed(format!(
                    "{what} {digest} from {}: more than {limit} bytes",
                    reg.display()
                )));
            }
        }
        verify(&bytes, digest, size, what, &reg.display())?;
        Ok(SmallBlob {
            bytes,
            content_type: resp.content_type,
        })
    }

    async fn content_info(&self, digest: &str) -> EffectResult<Option<ContentInfo>> {
        match self
            .content()
            .info(self.req(
                InfoRequest {
                    digest: digest.to_string(),
                },
                None,
            ))
            .await
        {
            Ok(r) => Ok(r.into_inner().info),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(grpc_failed("content info", &s)),
        }
    }

    async fn read_content(
        &self,
        digest: &str,
        size: i64,
        lease: Option<&str>,
    ) -> EffectResult<Vec<u8>> {
        if !(0..=MAX_SMALL_BLOB).contains(&size) {
            return Err(EffectError::Failed(format!(
                "content {digest}: size {size} is over the {MAX_SMALL_BLOB}-byte limit"
            )));
        }
        let mut stream = self
            .content()
            .read(self.req(
                ReadContentRequest {
                    digest: digest.to_string(),
                    offset: 0,
                    size: 0,
                },
                lease,
            ))
            .await
            .map_err(|s| grpc_failed("read content", &s))?
            .into_inner();
        let mut bytes = Vec::with_capacity(size as usize);
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| grpc_failed("read content", &s))?
        {
            bytes.extend_from_slice(&msg.data);
            if bytes.len() > MAX_SMALL_BLOB as usize {
                return Err(EffectError::Failed(format!(
                    "content {digest}: more than {MAX_SMALL_BLOB} bytes"
                )));
            }
        }
        Ok(bytes)
    }

    /// Makes sure `desc` is in the content store with `labels` (added to what is there).
    /// `bytes` are the already verified contents of small blobs; layers are streamed from the
    /// registry, hashed on the way, and committed only when digest and size match.
    async fn ensure_blob(
        &self,
        reg: &RegistryRef,
        desc: &Descriptor,
        bytes: Option<&[u8]>,
        labels: HashMap<String, String>,
        lease: &str,
        progress: Option<&mut PullTracker>,
    ) -> EffectResult {
        if self.content_info(&desc.digest).await?.is_some() {
            return self.label_content(&desc.digest, labels, lease).await;
        }
        let kind = if bytes.is_some() { "blob" } else { "layer" };
        if !(0..=MAX_LAYER).contains(&desc.size) {
            return Err(EffectError::Failed(format!(
                "{kind} {}: size {} is out of range",
                desc.digest, desc.size
            )));
        }
        let source = match bytes {
            Some(b) => Source::Bytes(b),
            None => {
                let resp = reg.fetch(BlobKind::Blob, &desc.digest).await?;
                if let Some(len) = resp.content_length
                    && len != desc.size as u64
                {
                    return Err(EffectError::Failed(format!(
                        "{kind} {} from {}: registry sent {len} bytes, the manifest says {}",
                        desc.digest,
                        reg.display(),
                        desc.size
                    )));
                }
                Source::Http(Box::new(resp.body))
            }
        };
        let write_ref = format!("flexnode-{}", desc.digest.replace(':', "-"));
        let result = self
            .write_content(
                reg,
                desc,
                kind,
                &write_ref,
                source,
                labels.clone(),
                lease,
                progress,
            )
            .await;
        match result {
            Ok(WriteOutcome::Committed) => Ok(()),
            // Another writer finished it meanwhile: only the labels are ours to add.
            Ok(WriteOutcome::Existed) => self.label_content(&desc.digest, labels, lease).await,
            Err(e) => {
                // Best effort: drop the partial ingest (it would be collected anyway).
                let _ = self
                    .content()
                    .abort(self.req(AbortRequest { r#ref: write_ref }, Some(lease)))
                    .await;
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn write_content(
        &self,
        reg: &RegistryRef,
        desc: &Descriptor,
        kind: &str,
        write_ref: &str,
        mut source: Source<'_>,
        labels: HashMap<String, String>,
        lease: &str,
        mut progress: Option<&mut PullTracker>,
    ) -> EffectResult<WriteOutcome> {
        let failed = |e: &Status| grpc_failed(&format!("write {kind} {}", desc.digest), e);
        let (mut tx, rx) = futures::channel::mpsc::channel::<WriteContentRequest>(2);
        let base = WriteContentRequest {
            r#ref: write_ref.to_string(),
            total: desc.size,
            expected: desc.digest.clone(),
            ..Default::default()
        };
        // The server answers each message; it sends nothing before the first one arrives.
        tx.send(WriteContentRequest {
            action: WriteAction::Stat as i32,
            ..base.clone()
        })
        .await
        .map_err(|e| EffectError::Failed(format!("content write: {e}")))?;
        let mut responses = match self.content().write(self.req(rx, Some(lease))).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::AlreadyExists => return Ok(WriteOutcome::Existed),
            Err(s) => return Err(failed(&s)),
        };
        match responses.message().await {
            Ok(_) => {}
            Err(s) if s.code() == Code::AlreadyExists => return Ok(WriteOutcome::Existed),
            Err(s) => return Err(failed(&s)),
        }
        let mut hasher = Sha256::new();
        let mut offset: i64 = 0;
        loop {
            let chunk = match &mut source {
                Source::Bytes(b) => {
                    let start = offset as usize;
                    if start >= b.len() {
                        None
                    } else {
                        let end = (start + WRITE_CHUNK).min(b.len());
                        Some(b[start..end].to_vec())
                    }
                }
                Source::Http(body) => body.next_chunk(WRITE_CHUNK).await.map_err(|e| {
                    EffectError::Failed(format!(
                        "{kind} {} from {}: {e}",
                        desc.digest,
                        reg.display()
                    ))
                })?,
            };
            let Some(chunk) = chunk else { break };
            if offset + len_i64(chunk.len()) > desc.size {
                return Err(EffectError::Failed(format!(
                    "{kind} {} from {}: more than the {} bytes the manifest declares; \
                     nothing was committed",
                    desc.digest,
                    reg.display(),
                    desc.size
                )));
            }
            hasher.update(&chunk);
            let chunk_len = chunk.len();
            let len = len_i64(chunk_len);
            tx.send(WriteContentRequest {
                action: WriteAction::Write as i32,
                offset,
                data: chunk,
                ..base.clone()
            })
            .await
            .map_err(|e| EffectError::Failed(format!("content write: {e}")))?;
            responses.message().await.map_err(|s| failed(&s))?;
            offset += len;
            if let Some(p) = progress.as_deref_mut() {
                p.bytes(&desc.digest, chunk_len);
            }
        }
        let got = format!("sha256:{}", hex::encode(hasher.finalize()));
        if offset != desc.size {
            return Err(EffectError::Failed(format!(
                "{kind} {} from {}: got {offset} bytes, the manifest declares {}; \
                 nothing was committed",
                desc.digest,
                reg.display(),
                desc.size
            )));
        }
        if got != desc.digest {
            return Err(EffectError::Failed(format!(
                "{kind} {} from {}: sha256 verification failed (the data hashes to {got}); \
                 nothing was committed",
                desc.digest,
                reg.display()
            )));
        }
        tx.send(WriteContentRequest {
            action: WriteAction::Commit as i32,
            offset,
            labels,
            ..base
        })
        .await
        .map_err(|e| EffectError::Failed(format!("content write: {e}")))?;
        let committed = responses.message().await;
        drop(tx);
        match committed {
            Ok(_) => Ok(WriteOutcome::Committed),
            Err(s) if s.code() == Code::AlreadyExists => Ok(WriteOutcome::Existed),
            Err(s) => Err(failed(&s)),
        }
    }

    async fn label_content(
        &self,
        digest: &str,
        labels: HashMap<String, String>,
        lease: &str,
    ) -> EffectResult {
        if labels.is_empty() {
            return Ok(());
        }
        let paths = labels.keys().map(|k| format!("labels.{k}")).collect();
        self.content()
            .update(self.req(
                UpdateContentRequest {
                    info: Some(ContentInfo {
                        digest: digest.to_string(),
                        labels,
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                },
                Some(lease),
            ))
            .await
            .map_err(|s| grpc_failed(&format!("label content {digest}"), &s))?;
        Ok(())
    }

    async fn unpack(
        &self,
        layers: &[Descriptor],
        diff_ids: &[String],
        chain_ids: &[String],
        lease: &str,
    ) -> EffectResult {
        let mut parent = String::new();
        for ((layer, diff_id), chain_id) in layers.iter().zip(diff_ids).zip(chain_ids) {
            if !self.snapshot_exists(chain_id).await? {
                self.apply_layer(layer, diff_id, chain_id, &parent, lease)
                    .await?;
            }
            parent.clone_from(chain_id);
        }
        Ok(())
    }

    /// Whether the snapshotter has a snapshot under `key` (a chainID for committed layers).
    pub async fn snapshot_exists(&self, key: &str) -> EffectResult<bool> {
        match self
            .snapshots()
            .stat(self.req(
                StatSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: key.to_string(),
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(s) => Err(grpc_failed("stat snapshot", &s)),
        }
    }

    async fn apply_layer(
        &self,
        layer: &Descriptor,
        diff_id: &str,
        chain_id: &str,
        parent: &str,
        lease: &str,
    ) -> EffectResult {
        let mut unique = [0u8; 8];
        getrandom::fill(&mut unique).map_err(|e| EffectError::Failed(format!("random: {e}")))?;
        let key = format!("extract-{} {chain_id}", hex::encode(unique));
        let mounts = self
            .snapshots()
            .prepare(self.req(
                PrepareSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: key.clone(),
                    parent: parent.to_string(),
                    labels: HashMap::new(),
                },
                Some(lease),
            ))
            .await
            .map_err(|s| grpc_failed(&format!("prepare snapshot for {chain_id}"), &s))?
            .into_inner()
            .mounts;
        let result = self
            .apply_and_commit(layer, diff_id, chain_id, &key, mounts, lease)
            .await;
        if result.is_err() {
            let _ = self
                .snapshots()
                .remove(self.req(
                    RemoveSnapshotRequest {
                        snapshotter: self.snapshotter.clone(),
                        key,
                    },
                    Some(lease),
                ))
                .await;
        }
        result
    }

    async fn apply_and_commit(
        &self,
        layer: &Descriptor,
        diff_id: &str,
        chain_id: &str,
        key: &str,
        mounts: Vec<Mount>,
        lease: &str,
    ) -> EffectResult {
        let applied = DiffClient::new(self.channel.clone())
            .apply(self.req(
                ApplyRequest {
                    diff: Some(layer.clone()),
                    mounts,
                    ..Default::default()
                },
                Some(lease),
            ))
            .await
            .map_err(|s| grpc_failed(&format!("apply layer {}", layer.digest), &s))?
            .into_inner()
            .applied;
        let applied_digest = applied.map(|d| d.digest).unwrap_or_default();
        if applied_digest != diff_id {
            return Err(EffectError::Failed(format!(
                "layer {}: uncompressed digest {applied_digest} does not match the config's \
                 diffID {diff_id}",
                layer.digest
            )));
        }
        match self
            .snapshots()
            .commit(self.req(
                CommitSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    name: chain_id.to_string(),
                    key: key.to_string(),
                    labels: HashMap::new(),
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => Ok(()),
            // A concurrent unpack committed the same layer: ours is dropped by the caller.
            Err(s) if s.code() == Code::AlreadyExists => Err(EffectError::Failed(format!(
                "snapshot {chain_id} appeared during the unpack; retry"
            ))),
            Err(s) => Err(grpc_failed(&format!("commit snapshot {chain_id}"), &s)),
        }
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

// ---------------------------------------------------------------------------------------------
// Containers: create (image snapshot + hand-built OCI runtime spec), start, stop, delete.

/// The label on every container (and its snapshot) the agent creates; the only ones it deletes.
pub const MANAGED_LABEL: &str = "flexnode.io/managed";
pub const MANAGED_VALUE: &str = "true";
/// The runtime shim containers run under.
pub const RUNC_RUNTIME: &str = "io.containerd.runc.v2";
/// `Any.type_url` containerd expects for an OCI runtime spec (JSON).
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const SIGTERM: u32 = 15;
const SIGKILL: u32 = 9;

/// Every Linux capability, in kernel order (index = capability number); privileged containers
/// get those of them in this process's bounding set.
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// containerd's (and Docker's) default set for unprivileged containers.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A host path bound into a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindMount {
    /// Absolute path on the host.
    pub source: std::path::PathBuf,
    /// Absolute path in the container.
    pub destination: String,
    pub read_only: bool,
}

/// Where a task's stdout and stderr go (stdin is always empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskIo {
    /// `/dev/null`.
    Null,
    /// Appended to these host files (created if missing) by the shim.
    Files {
        stdout: std::path::PathBuf,
        stderr: std::path::PathBuf,
    },
}

/// How `stop_container` ended a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopOutcome {
    /// As containerd reports it (128 + signal for a killed process).
    pub exit_status: u32,
    /// SIGTERM was not enough within the grace period: SIGKILL was sent.
    pub killed: bool,
}

/// A task's state as containerd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskState {
    pub pid: u32,
    /// `CREATED`, `RUNNING`, `STOPPED`, `PAUSED`, `PAUSING` or `UNKNOWN`.
    pub status: String,
    pub exit_status: u32,
}

/// What a container's rootfs is made from: the image's top chainID and its config.
struct ImageForContainer {
    name: String,
    top_chain_id: String,
    env: Vec<String>,
    cwd: String,
}

impl GrpcContainerd {
    fn containers(&self) -> ContainersClient<Channel> {
        ContainersClient::new(self.channel.clone())
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }

    /// Creates container `id` from the pulled image `image_digest`: a new active snapshot
    /// (key `id`) on the image's top chainID, and a container record (runtime runc v2, an OCI
    /// spec built here) labelled [`MANAGED_LABEL`]. `privileged`: every capability, no
    /// seccomp, every device (host `/dev` nodes and an allow-all device cgroup), `/sys`
    /// writable, nothing masked. Otherwise: containerd's default capabilities, masked and
    /// read-only `/proc` paths, the default device set. No seccomp profile is applied in either
    /// case, and no resource limits are set. New pid, ipc, uts, mount and network namespaces.
    ///
    /// Idempotent: an existing managed container of that id is left as it is.
    pub async fn create_container(
        &self,
        id: &str,
        image_digest: &Sha256Hex,
        args: &[String],
        privileged: bool,
        mounts: &[BindMount],
    ) -> EffectResult {
        check_container_id(id)?;
        if args.is_empty() {
            return Err(EffectError::Failed(format!(
                "container {id}: no process arguments"
            )));
        }
        for m in mounts {
            if !m.source.is_absolute() || !m.destination.starts_with('/') {
                return Err(EffectError::Failed(format!(
                    "container {id}: mount paths must be absolute ({} -> {})",
                    m.source.display(),
                    m.destination
                )));
            }
        }
        if let Some(existing) = self.container_record(id).await? {
            if is_managed(&existing.labels) {
                return Ok(());
            }
            return Err(EffectError::Failed(format!(
                "container {id} exists and was not created by flexnode; refusing to touch it"
            )));
        }
        let image = self.image_for_container(image_digest).await?;
        let spec = self.runtime_spec(id, args, privileged, mounts, &image)?;
        let lease = self.create_lease("container").await?;
        let result = self.create_under_lease(id, &image, spec, &lease).await;
        let released = self.delete_lease(&lease).await;
        result?;
        released
    }

    async fn create_under_lease(
        &self,
        id: &str,
        image: &ImageForContainer,
        spec: Vec<u8>,
        lease: &str,
    ) -> EffectResult {
        let labels = HashMap::from([(MANAGED_LABEL.to_string(), MANAGED_VALUE.to_string())]);
        match self
            .snapshots()
            .prepare(self.req(
                PrepareSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: id.to_string(),
                    parent: image.top_chain_id.clone(),
                    labels: labels.clone(),
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => {}
            // Left by an earlier attempt that crashed before the record: reuse it.
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) => {
                return Err(grpc_failed(
                    &format!("container {id}: prepare snapshot"),
                    &s,
                ));
            }
        }
        let container = Container {
            id: id.to_string(),
            labels,
            image: image.name.clone(),
            runtime: Some(ContainerRuntime {
                name: RUNC_RUNTIME.to_string(),
                options: None,
            }),
            spec: Some(prost_types::Any {
                type_url: SPEC_TYPE_URL.to_string(),
                value: spec,
            }),
            snapshotter: self.snapshotter.clone(),
            snapshot_key: id.to_string(),
            ..Default::default()
        };
        match self
            .containers()
            .create(self.req(
                CreateContainerRequest {
                    container: Some(container),
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => Ok(()),
            Err(s) => Err(grpc_failed(&format!("create container {id}"), &s)),
        }
    }

    /// Creates and starts the task of container `id` (its rootfs: the snapshot's mounts);
    /// returns the PID of its first process. A task already running: its PID.
    pub async fn start_container(&self, id: &str, io: &TaskIo) -> EffectResult<u32> {
        check_container_id(id)?;
        let record = self
            .container_record(id)
            .await?
            .ok_or_else(|| EffectError::Failed(format!("container {id} does not exist")))?;
        if let Some(task) = self.task_state(id).await? {
            match task.status.as_str() {
                "RUNNING" => return Ok(task.pid),
                "CREATED" => {}
                _ => {
                    // A task that ran and ended: clear it to start afresh.
                    self.delete_task(id).await?;
                }
            }
        }
        if self.task_state(id).await?.is_none() {
            let rootfs = self
                .snapshots()
                .mounts(self.req(
                    MountsRequest {
                        snapshotter: record.snapshotter.clone(),
                        key: record.snapshot_key.clone(),
                    },
                    None,
                ))
                .await
                .map_err(|s| grpc_failed(&format!("container {id}: snapshot mounts"), &s))?
                .into_inner()
                .mounts;
            let (stdout, stderr) = match io {
                TaskIo::Null => (String::new(), String::new()),
                TaskIo::Files { stdout, stderr } => (file_uri(stdout)?, file_uri(stderr)?),
            };
            self.tasks()
                .create(self.req(
                    CreateTaskRequest {
                        container_id: id.to_string(),
                        rootfs,
                        stdout,
                        stderr,
                        ..Default::default()
                    },
                    None,
                ))
                .await
                .map_err(|s| grpc_failed(&format!("create task {id}"), &s))?;
        }
        let started = self
            .tasks()
            .start(self.req(
                StartRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await;
        match started {
            Ok(r) => Ok(r.into_inner().pid),
            Err(s) => {
                // Leave no half-made task behind.
                let _ = self.delete_task(id).await;
                Err(grpc_failed(&format!("start task {id}"), &s))
            }
        }
    }

    /// The state of container `id`'s task, `None` when it has none.
    pub async fn task_state(&self, id: &str) -> EffectResult<Option<TaskState>> {
        match self
            .tasks()
            .get(self.req(
                GetRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await
        {
            Ok(r) => Ok(r.into_inner().process.map(|p| TaskState {
                pid: p.pid,
                status: TaskStatus::try_from(p.status)
                    .unwrap_or(TaskStatus::Unknown)
                    .as_str_name()
                    .to_string(),
                exit_status: p.exit_status,
            })),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(grpc_failed(&format!("get task {id}"), &s)),
        }
    }

    /// Stops container `id`'s task: SIGTERM to its first process, up to `grace` for it to end,
    /// then SIGKILL to every process of the task; then the task is deleted. `None`: there was
    /// no task.
    pub async fn stop_container(
        &self,
        id: &str,
        grace: Duration,
    ) -> EffectResult<Option<StopOutcome>> {
        check_container_id(id)?;
        let Some(task) = self.task_state(id).await? else {
            return Ok(None);
        };
        let mut killed = false;
        let exit_status = if task.status == "STOPPED" {
            task.exit_status
        } else {
            let termed = if task.status == "RUNNING" || task.status == "PAUSED" {
                self.kill_task(id, SIGTERM, false).await?;
                tokio::time::timeout(grace, self.wait_task(id)).await.ok()
            } else {
                None
            };
            match termed {
                Some(status) => status?,
                None => {
                    killed = true;
                    self.kill_task(id, SIGKILL, true).await?;
                    tokio::time::timeout(Duration::from_secs(30), self.wait_task(id))
                        .await
                        .map_err(|_| {
                            EffectError::Failed(format!(
                                "container {id}: task still running 30 s after SIGKILL"
                            ))
                        })??
                }
            }
        };
        self.delete_task(id).await?;
        Ok(Some(StopOutcome {
            exit_status,
            killed,
        }))
    }

    async fn kill_task(&self, id: &str, signal: u32, all: bool) -> EffectResult {
        match self
            .tasks()
            .kill(self.req(
                KillRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                    signal,
                    all,
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            // Already gone (exited between the state read and the signal).
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("signal {signal} to task {id}"), &s)),
        }
    }

    /// Waits until the task's first process has exited; its exit status.
    async fn wait_task(&self, id: &str) -> EffectResult<u32> {
        self.tasks()
            .wait(self.req(
                WaitRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await
            .map(|r| r.into_inner().exit_status)
            .map_err(|s| grpc_failed(&format!("wait for task {id}"), &s))
    }

    async fn delete_task(&self, id: &str) -> EffectResult {
        match self
            .tasks()
            .delete(self.req(
                DeleteTaskRequest {
                    container_id: id.to_string(),
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("delete task {id}"), &s)),
        }
    }

    /// Deletes container `id` and its snapshot. Refused while it has a running task (stop it
    /// first) and for containers the agent did not create. Absent: nothing to do (a managed
    /// snapshot left under the key by a crash is still removed).
    pub async fn delete_container(&self, id: &str) -> EffectResult {
        check_container_id(id)?;
        let record = self.container_record(id).await?;
        let (snapshotter, key) = match &record {
            Some(c) => {
                if !is_managed(&c.labels) {
                    return Err(EffectError::Failed(format!(
                        "container {id} was not created by flexnode (no {MANAGED_LABEL} label); \
                         refusing to delete it"
                    )));
                }
                (c.snapshotter.clone(), c.snapshot_key.clone())
            }
            None => (self.snapshotter.clone(), id.to_string()),
        };
        if let Some(task) = self.task_state(id).await? {
            if task.status != "STOPPED" && task.status != "CREATED" {
                return Err(EffectError::Failed(format!(
                    "container {id}: its task is {}; stop it before deleting",
                    task.status
                )));
            }
            self.delete_task(id).await?;
        }
        if record.is_some() {
            match self
                .containers()
                .delete(self.req(DeleteContainerRequest { id: id.to_string() }, None))
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == Code::NotFound => {}
                Err(s) => return Err(grpc_failed(&format!("delete container {id}"), &s)),
            }
        }
        // The snapshot: only if it is ours (labelled), whether the record was there or not.
        let info = match self
            .snapshots()
            .stat(self.req(
                StatSnapshotRequest {
                    snapshotter: snapshotter.clone(),
                    key: key.clone(),
                },
                None,
            ))
            .await
        {
            Ok(r) => r.into_inner().info,
            Err(s) if s.code() == Code::NotFound => return Ok(()),
            Err(s) => return Err(grpc_failed(&format!("container {id}: stat snapshot"), &s)),
        };
        if !info.as_ref().is_some_and(|i| is_managed(&i.labels)) {
            if record.is_some() {
                tracing::warn!(container = id, snapshot = %key, "snapshot not labelled as flexnode's; left in place");
            }
            return Ok(());
        }
        match self
            .snapshots()
            .remove(self.req(RemoveSnapshotRequest { snapshotter, key }, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("container {id}: remove snapshot"), &s)),
        }
    }

    /// Ids of the containers labelled [`MANAGED_LABEL`] in the namespace.
    pub async fn managed_containers(&self) -> EffectResult<Vec<String>> {
        let list = self
            .containers()
            .list(self.req(
                ListContainersRequest {
                    filters: vec![format!("labels.\"{MANAGED_LABEL}\"=={MANAGED_VALUE}")],
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("list containers", &s))?
            .into_inner();
        let mut ids: Vec<String> = list
            .containers
            .into_iter()
            .filter(|c| is_managed(&c.labels))
            .map(|c| c.id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn container_record(&self, id: &str) -> EffectResult<Option<Container>> {
        match self
            .containers()
            .get(self.req(GetContainerRequest { id: id.to_string() }, None))
            .await
        {
            Ok(r) => Ok(r.into_inner().container),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(grpc_failed(&format!("get container {id}"), &s)),
        }
    }

    /// The pulled image of `digest` (a record, agent-pulled preferred), resolved to its top
    /// chainID (which must be unpacked in this snapshotter) and its config's Env and WorkingDir.
    async fn image_for_container(&self, digest: &Sha256Hex) -> EffectResult<ImageForContainer> {
        let want = digest.oci();
        let mut images: Vec<Image> = self
            .images()
            .list(self.req(
                ListImagesRequest {
                    filters: vec![format!("target.digest==\"{want}\"")],
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("list images", &s))?
            .into_inner()
            .images
            .into_iter()
            .filter(|i| i.target.as_ref().map(|t| t.digest.as_str()) == Some(want.as_str()))
            .collect();
        images.sort_by_key(|i| !is_agent_pulled(i));
        let image = images.into_iter().next().ok_or_else(|| {
            EffectError::Failed(format!("image {want} is not pulled (no image record)"))
        })?;
        let target = image.target.clone().unwrap_or_default();
        let top = self.read_content(&want, target.size, None).await?;
        verify(
            &top,
            &want,
            Some(target.size),
            "manifest",
            "the content store",
        )?;
        let top_json = parse_json(&top, "manifest", &want)?;
        let manifest_bytes = if is_index(&media_type_of(&top_json, Some(&target.media_type))) {
            let (_, desc) = self.pick_platform(&top_json, &want)?;
            let bytes = self.read_content(&desc.digest, desc.size, None).await?;
            verify(
                &bytes,
                &desc.digest,
                Some(desc.size),
                "manifest",
                "the content store",
            )?;
            bytes
        } else {
            top
        };
        let manifest = Manifest::parse(&manifest_bytes, &want)?;
        let config = self
            .read_content(&manifest.config.digest, manifest.config.size, None)
            .await?;
        verify(
            &config,
            &manifest.config.digest,
            Some(manifest.config.size),
            "config",
            "the content store",
        )?;
        let diff_ids = config_diff_ids(&config, &manifest.config.digest)?;
        let top_chain_id = chain_ids(&diff_ids).pop().ok_or_else(|| {
            EffectError::Failed(format!("image {want}: the config lists no layers"))
        })?;
        if !self.snapshot_exists(&top_chain_id).await? {
            return Err(EffectError::Failed(format!(
                "image {want} is not unpacked in the {} snapshotter (no snapshot {top_chain_id})",
                self.snapshotter
            )));
        }
        let cfg = parse_json(&config, "config", &manifest.config.digest)?;
        let cfg = cfg.get("config");
        let mut env: Vec<String> = cfg
            .and_then(|c| c.get("Env"))
            .and_then(|e| e.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !env.iter().any(|e| e.starts_with("PATH=")) {
            env.insert(0, DEFAULT_PATH.to_string());
        }
        let cwd = cfg
            .and_then(|c| c.get("WorkingDir"))
            .and_then(|w| w.as_str())
            .filter(|w| w.starts_with('/'))
            .unwrap_or("/")
            .to_string();
        Ok(ImageForContainer {
            name: image.name,
            top_chain_id,
            env,
            cwd,
        })
    }

    /// The OCI runtime spec (JSON) of a container, built by hand.
    fn runtime_spec(
        &self,
        id: &str,
        args: &[String],
        privileged: bool,
        mounts: &[BindMount],
        image: &ImageForContainer,
    ) -> EffectResult<Vec<u8>> {
        use serde_json::json;
        let caps: Vec<&str> = if privileged {
            // As containerd's WithPrivileged: every capability this process may hand on (its
            // bounding set; a sandboxed host may lack some), since runc fails on any other.
            let bounding = bounding_caps();
            ALL_CAPS
                .iter()
                .enumerate()
                .filter(|(i, _)| bounding & (1u64 << i) != 0)
                .map(|(_, c)| *c)
                .collect()
        } else {
            DEFAULT_CAPS.to_vec()
        };
        let sys_options = if privileged {
            json!(["nosuid", "noexec", "nodev", "rw"])
        } else {
            json!(["nosuid", "noexec", "nodev", "ro"])
        };
        let mut spec_mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
            json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                   "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
            json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                   "options": ["nosuid", "noexec", "nodev"]}),
            json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
                   "options": sys_options}),
            json!({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        ];
        for m in mounts {
            spec_mounts.push(json!({
                "destination": m.destination,
                "type": "bind",
                "source": m.source,
                "options": ["rbind", "rprivate", if m.read_only { "ro" } else { "rw" }],
            }));
        }
        let mut linux = json!({
            "namespaces": [
                {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
                {"type": "network"}
            ],
            "cgroupsPath": format!("/{}/{id}", self.namespace),
        });
        if privileged {
            linux["resources"] = json!({"devices": [{"allow": true, "access": "rwm"}]});
            linux["devices"] = serde_json::Value::Array(host_devices());
        } else {
            linux["resources"] = json!({"devices": [{"allow": false, "access": "rwm"}]});
            linux["maskedPaths"] = json!(MASKED_PATHS);
            linux["readonlyPaths"] = json!(READONLY_PATHS);
        }
        let spec = json!({
            "ociVersion": "1.0.2",
            "process": {
                "terminal": false,
                "user": {"uid": 0, "gid": 0},
                "args": args,
                "env": image.env,
                "cwd": image.cwd,
                "capabilities": {
                    "bounding": caps, "effective": caps, "permitted": caps,
                },
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
                "noNewPrivileges": !privileged,
            },
            "root": {"path": "rootfs", "readonly": false},
            "hostname": id,
            "mounts": spec_mounts,
            "linux": linux,
        });
        serde_json::to_vec(&spec)
            .map_err(|e| EffectError::Failed(format!("container {id}: runtime spec: {e}")))
    }
}

/// This process's capability bounding set (`CapBnd` in /proc/self/status); every known
/// capability when it cannot be read.
fn bounding_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(u64::MAX)
}

fn is_managed(labels: &HashMap<String, String>) -> bool {
    labels.get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_VALUE)
}

/// Container ids as containerd accepts them (`[A-Za-z0-9][A-Za-z0-9_.-]*`, at most 76).
fn check_container_id(id: &str) -> EffectResult {
    let ok = !id.is_empty()
        && id.len() <= 76
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EffectError::Failed(format!("invalid container id {id:?}")))
    }
}

/// `file://` URI of an absolute host path, for the shim's stdio.
fn file_uri(path: &Path) -> EffectResult<String> {
    let s = path
        .to_str()
        .filter(|s| s.starts_with('/'))
        .ok_or_else(|| {
            EffectError::Failed(format!(
                "task output {} must be an absolute UTF-8 path",
                path.display()
            ))
        })?;
    if s.bytes()
        .any(|b| b.is_ascii_control() || b == b'%' || b == b'?' || b == b'#')
    {
        return Err(EffectError::Failed(format!(
            "task output path {s:?} has characters a file:// URI cannot carry"
        )));
    }
    Ok(format!("file://{s}"))
}

/// The host's device nodes under /dev (not pts, shm, mqueue: the container mounts its own),
/// as `linux.devices` entries, as containerd's `WithHostDevices` does for privileged ones.
fn host_devices() -> Vec<serde_json::Value> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/dev")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                let skip = [
                    "/dev/pts",
                    "/dev/shm",
                    "/dev/mqueue",
                    "/dev/.lxc",
                    "/dev/.udev",
                ];
                if !skip.iter().any(|s| path == Path::new(s)) {
                    dirs.push(path);
                }
                continue;
            }
            let kind = if ft.is_char_device() {
                "c"
            } else if ft.is_block_device() {
                "b"
            } else {
                continue;
            };
            // /dev/console belongs to the container's terminal setup.
            if path == Path::new("/dev/console") || path == Path::new("/dev/ptmx") {
                continue;
            }
            let rdev = meta.rdev();
            let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
            let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
            out.push(serde_json::json!({
                "path": path,
                "type": kind,
                "major": major,
                "minor": minor,
                "fileMode": meta.mode() & 0o7777,
                "uid": meta.uid(),
                "gid": meta.gid(),
            }));
        }
    }
    out
}

fn is_agent_pulled(image: &Image) -> bool {
    image.labels.get(PULLED_BY_LABEL).map(String::as_str) == Some(PULLED_BY_VALUE)
}

fn grpc_failed(what: &str, status: &Status) -> EffectError {
    EffectError::Failed(format!(
        "containerd: {what}: {} ({:?})",
        status.message(),
        status.code()
    ))
}

fn len_i64(n: usize) -> i64 {
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

fn verify(bytes: &[u8], digest: &str, size: Option<i64>, what: &str, from: &str) -> EffectResult {
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

fn parse_json(bytes: &[u8], what: &str, digest: &str) -> EffectResult<serde_json::Value> {
    serde_json::from_slice(bytes)
        .map_err(|e| EffectError::Failed(format!("{what} {digest} is not valid JSON: {e}")))
}

fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

/// The `mediaType` field, else the registry's Content-Type, else guessed from the shape.
fn media_type_of(json: &serde_json::Value, content_type: Option<&str>) -> String {
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

fn descriptor(v: &serde_json::Value, what: &str, parent: &str) -> EffectResult<Descriptor> {
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

struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

impl Manifest {
    fn parse(bytes: &[u8], digest: &str) -> EffectResult<Self> {
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

fn config_diff_ids(bytes: &[u8], digest: &str) -> EffectResult<Vec<String>> {
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

struct SmallBlob {
    bytes: Vec<u8>,
    content_type: Option<String>,
}

enum Source<'a> {
    Bytes(&'a [u8]),
    Http(Box<Body>),
}

enum WriteOutcome {
    Committed,
    Existed,
}

#[derive(Clone, Copy)]
enum BlobKind {
    Manifest,
    Blob,
}

impl BlobKind {
    fn name(self) -> &'static str {
        match self {
            Self::Manifest => "manifest",
            Self::Blob => "blob",
        }
    }
}

/// `registry/repository@sha256:…`, with where to reach the registry.
#[derive(Clone, Debug)]
struct RegistryRef {
    /// As written in the reference (`127.0.0.1:5000`).
    registry: String,
    repository: String,
    digest: Sha256Hex,
    timeout: Duration,
}

impl RegistryRef {
    fn parse(reference: &str, digest: &Sha256Hex, timeout: Duration) -> EffectResult<Self> {
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
            digest: pinned,
            timeout,
        })
    }

    fn display(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    fn pinned(&self) -> String {
        format!(
            "{}/{}@{}",
            self.registry,
            self.repository,
            self.digest.oci()
        )
    }

    async fn fetch(&self, kind: BlobKind, digest: &str) -> EffectResult<HttpResponse> {
        let what = kind.name();
        let (path, accept) = match kind {
            BlobKind::Manifest => (
                format!("/v2/{}/manifests/{digest}", self.repository),
                [
                    MEDIA_OCI_MANIFEST,
                    MEDIA_OCI_INDEX,
                    MEDIA_DOCKER_MANIFEST,
                    MEDIA_DOCKER_LIST,
                ]
                .join(", "),
            ),
            BlobKind::Blob => (
                format!("/v2/{}/blobs/{digest}", self.repository),
                "*/*".to_string(),
            ),
        };
        let mut authority = Authority::parse(&self.registry)?;
        let mut path = path;
        for _ in 0..=MAX_REDIRECTS {
            authority.require_plain_http_allowed()?;
            let resp = http_get(&authority, &path, &accept, self.timeout)
                .await
                .map_err(|e| {
                    EffectError::Failed(format!("{what} {digest} from {}: {e}", self.display()))
                })?;
            match resp.status {
                200 => return Ok(resp),
                301 | 302 | 303 | 307 | 308 => {
                    let location = resp.location.clone().ok_or_else(|| {
                        EffectError::Failed(format!(
                            "{what} {digest} from {}: redirect without a location",
                            self.display()
                        ))
                    })?;
                    (authority, path) = redirect(&authority, &location)?;
                }
                404 => {
                    return Err(EffectError::Failed(format!(
                        "{what} {digest} not found in {}",
                        self.display()
                    )));
                }
                401 | 403 => {
                    return Err(EffectError::Failed(format!(
                        "{what} {digest} from {}: the registry requires authentication \
                         (HTTP {}), which flexnode does not support",
                        self.display(),
                        resp.status
                    )));
                }
                other => {
                    return Err(EffectError::Failed(format!(
                        "{what} {digest} from {}: HTTP {other}",
                        self.display()
                    )));
                }
            }
        }
        Err(EffectError::Failed(format!(
            "{what} {digest} from {}: more than {MAX_REDIRECTS} redirects",
            self.display()
        )))
    }
}

/// `host[:port]` of a registry or redirect target, with its scheme.
#[derive(Clone, Debug)]
struct Authority {
    host: String,
    port: u16,
    https: bool,
}

impl Authority {
    /// A registry as written in an image reference: https unless it is a loopback host.
    fn parse(registry: &str) -> EffectResult<Self> {
        let (host, port) = split_host_port(registry)?;
        let https = !is_loopback(&host);
        Ok(Self {
            port: port.unwrap_or(if https { 443 } else { 80 }),
            host,
            https,
        })
    }

    fn require_plain_http_allowed(&self) -> EffectResult {
        if self.https {
            return Err(EffectError::Failed(format!(
                "registry {}: HTTPS registries are not supported yet (no TLS client); only \
                 loopback registries over plain HTTP are",
                self.host
            )));
        }
        if !is_loopback(&self.host) {
            return Err(EffectError::Failed(format!(
                "registry {}: plain HTTP is only allowed to loopback registries",
                self.host
            )));
        }
        Ok(())
    }

    fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if (self.https && self.port == 443) || (!self.https && self.port == 80) {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

fn split_host_port(s: &str) -> EffectResult<(String, Option<u16>)> {
    let bad = || EffectError::Failed("invalid registry host".into());
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return Err(bad()),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = port
        .map(|p| p.parse::<u16>().map_err(|_| bad()))
        .transpose()?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_ascii_lowercase(), port))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn redirect(from: &Authority, location: &str) -> EffectResult<(Authority, String)> {
    if location.starts_with('/') {
        return Ok((from.clone(), location.to_string()));
    }
    let (https, rest) = if let Some(r) = location.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = location.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(EffectError::Failed(
            "registry redirect to an unsupported location".into(),
        ));
    };
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if auth.contains('@') {
        return Err(EffectError::Failed(
            "registry redirect with credentials refused".into(),
        ));
    }
    let (host, port) = split_host_port(auth)?;
    Ok((
        Authority {
            port: port.unwrap_or(if https { 443 } else { 80 }),
            host,
            https,
        },
        path.to_string(),
    ))
}

struct HttpResponse {
    status: u16,
    content_length: Option<u64>,
    content_type: Option<String>,
    location: Option<String>,
    body: Body,
}

/// A minimal HTTP/1.1 GET (one request per connection) for plain-HTTP loopback registries.
async fn http_get(
    authority: &Authority,
    path: &str,
    accept: &str,
    timeout: Duration,
) -> std::io::Result<HttpResponse> {
    let io_err = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
    let stream = tokio::time::timeout(
        timeout,
        TcpStream::connect((authority.host.as_str(), authority.port)),
    )
    .await
    .map_err(|_| timed_out())??;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::with_capacity(256 << 10, stream);
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: flexnode/{}\r\nAccept: {accept}\r\n\
         Accept-Encoding: identity\r\nConnection: close\r\n\r\n",
        authority.host_header(),
        crate::VERSION
    );
    tokio::time::timeout(timeout, reader.get_mut().write_all(request.as_bytes()))
        .await
        .map_err(|_| timed_out())??;

    let mut header_bytes = 0usize;
    let mut line = String::new();
    let mut read_line = async |reader: &mut BufReader<TcpStream>, line: &mut String| {
        line.clear();
        let n = tokio::time::timeout(timeout, reader.read_line(line))
            .await
            .map_err(|_| timed_out())??;
        header_bytes += n;
        if n == 0 {
            return Err(io_err("connection closed in the response header".into()));
        }
        if header_bytes > MAX_HEADER_BYTES {
            return Err(io_err("response header too large".into()));
        }
        Ok::<_, std::io::Error>(())
    };
    read_line(&mut reader, &mut line).await?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|_| line.starts_with("HTTP/1."))
        .ok_or_else(|| io_err("not an HTTP/1.x response".into()))?;
    let mut content_length = None;
    let mut content_type = None;
    let mut location = None;
    let mut chunked = false;
    loop {
        read_line(&mut reader, &mut line).await?;
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                content_length = Some(
                    v.parse::<u64>()
                        .map_err(|_| io_err("bad Content-Length".into()))?,
                );
            }
            "content-type" => content_type = Some(v.to_string()),
            "location" => location = Some(v.to_string()),
            "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
            _ => {}
        }
    }
    let mode = if chunked {
        content_length = None;
        BodyMode::Chunked { left_in_chunk: 0 }
    } else if let Some(n) = content_length {
        BodyMode::Length(n)
    } else {
        BodyMode::Eof
    };
    Ok(HttpResponse {
        status,
        content_length,
        content_type,
        location,
        body: Body {
            reader,
            mode,
            done: false,
            timeout,
        },
    })
}

enum BodyMode {
    Length(u64),
    Chunked { left_in_chunk: u64 },
    Eof,
}

struct Body {
    reader: BufReader<TcpStream>,
    mode: BodyMode,
    done: bool,
    timeout: Duration,
}

impl Body {
    /// Up to `max` bytes of the body; `None` at its end.
    async fn next_chunk(&mut self, max: usize) -> std::io::Result<Option<Vec<u8>>> {
        let mut out = vec![0u8; max];
        let mut filled = 0;
        while filled < max {
            let n = self.read_some(&mut out[filled..]).await?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            return Ok(None);
        }
        out.truncate(filled);
        Ok(Some(out))
    }

    async fn read_some(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let eof = || {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed before the end of the body",
            )
        };
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        match &mut self.mode {
            BodyMode::Length(left) => {
                if *left == 0 {
                    self.done = true;
                    return Ok(0);
                }
                let want = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                let n = self.read_raw(want, buf).await?;
                if n == 0 {
                    return Err(eof());
                }
                if let BodyMode::Length(left) = &mut self.mode {
                    *left -= n as u64;
                }
                Ok(n)
            }
            BodyMode::Eof => {
                let n = self.read_raw(buf.len(), buf).await?;
                if n == 0 {
                    self.done = true;
                }
                Ok(n)
            }
            BodyMode::Chunked { left_in_chunk } => {
                if *left_in_chunk == 0 {
                    let size = self.chunk_header().await?;
                    if size == 0 {
                        // Trailers, then the end.
                        loop {
                            let l = self.line().await?;
                            if l.trim_end_matches(['\r', '\n']).is_empty() {
                                break;
                            }
                        }
                        self.done = true;
                        return Ok(0);
                    }
                    self.mode = BodyMode::Chunked {
                        left_in_chunk: size,
                    };
                }
                let left = match &self.mode {
                    BodyMode::Chunked { left_in_chunk } => *left_in_chunk,
                    _ => 0,
                };
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = self.read_raw(want, buf).await?;
                if n == 0 {
                    return Err(eof());
                }
                let left = left - n as u64;
                self.mode = BodyMode::Chunked {
                    left_in_chunk: left,
                };
                if left == 0 {
                    let crlf = self.line().await?;
                    if !crlf.trim_end_matches(['\r', '\n']).is_empty() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "bad chunk terminator",
                        ));
                    }
                }
                Ok(n)
            }
        }
    }

    async fn read_raw(&mut self, want: usize, buf: &mut [u8]) -> std::io::Result<usize> {
        tokio::time::timeout(self.timeout, self.reader.read(&mut buf[..want]))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))?
    }

    async fn line(&mut self) -> std::io::Result<String> {
        let mut line = String::new();
        let n = tokio::time::timeout(
            self.timeout,
            (&mut self.reader).take(4096).read_line(&mut line),
        )
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed in a chunk header",
            ));
        }
        Ok(line)
    }

    async fn chunk_header(&mut self) -> std::io::Result<u64> {
        let line = self.line().await?;
        let size = line
            .trim_end_matches(['\r', '\n'])
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        u64::from_str_radix(size, 16)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> Sha256Hex {
        Sha256Hex::parse(&"ab".repeat(32)).unwrap_or_else(|| unreachable!())
    }

    #[test]
    fn progress_every_mib_and_per_layer() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::<PullProgress>::new()));
        let sink = seen.clone();
        let layer = |d: &str, size: i64| Descriptor {
            digest: d.to_string(),
            size,
            ..Default::default()
        };
        let layers = [layer("sha256:a", 10), layer("sha256:b", (5 << 20) / 2)];
        let mut t = PullTracker::new(
            Arc::new(move |p| sink.lock().unwrap_or_else(|e| e.into_inner()).push(p)),
            &layers,
        );
        t.layer_done(&layers[0]); // already in the store
        for _ in 0..5 {
            t.bytes("sha256:b", 512 << 10);
        }
        t.layer_done(&layers[1]);
        let got: Vec<_> = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|p| (p.layer_digest.clone(), p.bytes_done, p.layers_done))
            .collect();
        let total = 10 + (5 << 20) / 2;
        assert_eq!(
            got,
            [
                ("sha256:a".to_string(), 10, 1),
                ("sha256:b".to_string(), 10 + (1 << 20), 1),
                ("sha256:b".to_string(), 10 + (2 << 20), 1),
                ("sha256:b".to_string(), total, 2),
            ]
        );
        let last = seen.lock().unwrap_or_else(|e| e.into_inner()).pop();
        assert_eq!(
            last,
            Some(PullProgress {
                layer_digest: "sha256:b".into(),
                bytes_done: total,
                bytes_total: total,
                layers_done: 2,
                layers_total: 2,
            })
        );
    }

    #[test]
    fn chain_ids_match_containerd() {
        // From containerd's identity tests: ChainID(a, b) = sha256("a b").
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        let ids = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(ids[0], a);
        let expect = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(format!("{a} {b}").as_bytes()))
        );
        assert_eq!(ids[1], expect);
    }

    #[test]
    fn references_parse_strictly() {
        let d = digest();
        let t = Duration::from_secs(1);
        let ok = RegistryRef::parse(&format!("127.0.0.1:5000/e2e/agent@{}", d.oci()), &d, t);
        let r = ok.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "e2e/agent");
        assert_eq!(r.pinned(), format!("127.0.0.1:5000/e2e/agent@{}", d.oci()));
        let err = |s: &str| match RegistryRef::parse(s, &d, t) {
            Err(EffectError::Failed(m)) => m,
            other => panic!("{s}: {other:?}"),
        };
        assert!(err("127.0.0.1:5000/e2e/agent:v1").contains("not pinned"));
        let m = err(&format!("user:secret@127.0.0.1/agent@{}", d.oci()));
        assert!(!m.contains("secret"), "{m}");
        let other = format!("sha256:{}", "cd".repeat(32));
        assert!(err(&format!("127.0.0.1/agent@{other}")).contains("requested"));
    }

    /// Serves one canned response on 127.0.0.1 and returns the request it got.
    async fn serve_once(response: Vec<u8>) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let port = listener.local_addr().map_or(0, |a| a.port());
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap_or_else(|e| panic!("{e}"));
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let _ = sock.write_all(&response).await;
            String::from_utf8_lossy(&req).into_owned()
        });
        (port, task)
    }

    async fn body_of(response: &str) -> (u16, Option<String>, std::io::Result<Vec<u8>>) {
        let (port, task) = serve_once(response.as_bytes().to_vec()).await;
        let auth = Authority::parse(&format!("127.0.0.1:{port}")).unwrap_or_else(|e| panic!("{e}"));
        let mut resp = http_get(&auth, "/v2/x/blobs/y", "*/*", Duration::from_secs(5))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut body = Vec::new();
        let result = loop {
            match resp.body.next_chunk(3).await {
                Ok(Some(c)) => body.extend_from_slice(&c),
                Ok(None) => break Ok(body),
                Err(e) => break Err(e),
            }
        };
        let req = task.await.unwrap_or_default();
        assert!(req.starts_with("GET /v2/x/blobs/y HTTP/1.1\r\n"), "{req}");
        assert!(
            req.contains(&format!("Host: 127.0.0.1:{port}\r\n")),
            "{req}"
        );
        (resp.status, resp.content_type, result)
    }

    #[tokio::test]
    async fn http_bodies_by_length_chunks_and_eof() {
        let (status, ct, body) = body_of(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\nhello world",
        )
        .await;
        assert_eq!((status, ct.as_deref()), (200, Some("application/json")));
        assert_eq!(body.unwrap_or_default(), b"hello world");
        let (_, _, body) = body_of(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n",
        )
        .await;
        assert_eq!(body.unwrap_or_default(), b"hello world");
        let (_, _, body) = body_of("HTTP/1.0 200 OK\r\n\r\nuntil eof").await;
        assert_eq!(body.unwrap_or_default(), b"until eof");
        // A body cut short is an error, not a short blob.
        let (_, _, body) = body_of("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nshort").await;
        assert!(body.is_err());
        let (_, _, body) =
            body_of("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort").await;
        assert!(body.is_err());
        let (status, _, _) = body_of("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(status, 404);
    }

    #[test]
    fn only_loopback_gets_plain_http() {
        for (reg, https) in [
            ("127.0.0.1:5000", false),
            ("localhost:5000", false),
            ("[::1]:5000", false),
            ("registry.example.com", true),
            ("10.0.0.1:5000", true),
        ] {
            let a = Authority::parse(reg).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(a.https, https, "{reg}");
            assert_eq!(a.require_plain_http_allowed().is_ok(), !https, "{reg}");
        }
        let (a, p) = redirect(
            &Authority::parse("127.0.0.1:5000").unwrap_or_else(|e| panic!("{e}")),
            "http://example.com/x",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p, "/x");
        assert!(a.require_plain_http_allowed().is_err());
    }
}
