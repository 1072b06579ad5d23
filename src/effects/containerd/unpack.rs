//! Unpacking: each layer applied onto its parent snapshot and committed as its chainID.

use super::{GrpcContainerd, grpc_failed};
use crate::effects::{EffectError, EffectResult};
use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{ApplyRequest, diff_client::DiffClient};
use containerd_client::tonic::Code;
use containerd_client::types::{Descriptor, Mount};
use std::collections::HashMap;

impl GrpcContainerd {
    pub(super) async fn unpack(
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
}
