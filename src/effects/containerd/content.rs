//! The content store: leases that hold a pull's content until its record exists, and blobs
//! written from the registry (hashed on the way, committed only when digest and size match),
//! read back and labelled.

use super::fetched::Body;
use super::progress::PullTracker;
use super::registry::{BlobKind, Registry};
use super::{
    GrpcContainerd, LEASE_EXPIRY_SECS, MAX_LAYER, MAX_SMALL_BLOB, WRITE_CHUNK, grpc_failed, len_i64,
};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::Timestamp;
use containerd_client::services::v1::{
    AbortRequest, CreateRequest as CreateLeaseRequest, DeleteRequest as DeleteLeaseRequest,
    Info as ContentInfo, InfoRequest, ReadContentRequest, ReadContentResponse,
    UpdateRequest as UpdateContentRequest, WriteAction, WriteContentRequest,
    leases_client::LeasesClient,
};
use containerd_client::tonic::{Code, Status};
use containerd_client::types::Descriptor;
use futures::SinkExt;
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;

pub(super) enum Source<'a> {
    Bytes(&'a [u8]),
    Http(Box<Body>),
}

pub(super) enum WriteOutcome {
    Committed,
    Existed,
}

impl GrpcContainerd {
    pub(super) async fn create_lease(&self, purpose: &str) -> EffectResult<String> {
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

    pub(super) async fn delete_lease(&self, id: &str) -> EffectResult {
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

    pub(super) async fn content_info(&self, digest: &str) -> EffectResult<Option<ContentInfo>> {
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

    /// The blob `digest` as the content store streams it.
    pub(super) async fn content_stream(
        &self,
        digest: &str,
        lease: Option<&str>,
    ) -> EffectResult<containerd_client::tonic::Streaming<ReadContentResponse>> {
        Ok(self
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
            .map_err(|s| grpc_failed(&format!("read content {digest}"), &s))?
            .into_inner())
    }

    pub(super) async fn read_content(
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
        let mut stream = self.content_stream(digest, lease).await?;
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
    pub(super) async fn ensure_blob(
        &self,
        reg: &Registry,
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
                        reg.origin(),
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
        reg: &Registry,
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
                        reg.origin()
                    ))
                })?,
            };
            let Some(chunk) = chunk else { break };
            if offset + len_i64(chunk.len()) > desc.size {
                return Err(EffectError::Failed(format!(
                    "{kind} {} from {}: more than the {} bytes the manifest declares; \
                     nothing was committed",
                    desc.digest,
                    reg.origin(),
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
            self.heartbeat.beat();
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
                reg.origin(),
                desc.size
            )));
        }
        if got != desc.digest {
            return Err(EffectError::Failed(format!(
                "{kind} {} from {}: sha256 verification failed (the data hashes to {got}); \
                 nothing was committed",
                desc.digest,
                reg.origin()
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
}
