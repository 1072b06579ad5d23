//! The containerd effects against a real containerd and docker-registry on 127.0.0.1
//! (`e2e/containerd/run`: plain HTTP, and over TLS with basic or token auth), each test once with Debian's containerd 1.6 (`…::v1_6::`) and
//! once with containerd 2.x built from `e2e/containerd/v2/go.mod` (`…::v2::`, built into the
//! cache by `.ci/run`). A missing tier fails; skipped only with FLEXNODE_SKIP_CONTAINERD=1. Needs root.
//!
//! What the tests check is read back independently of the code under test: chainIDs are
//! computed here from the config in the registry's storage, and records, content and
//! snapshots are looked up with plain gRPC calls (or `ctr`).

mod container;
mod pull;

use crate::support;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::StatSnapshotRequest;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{GetContainerRequest, GetRequest};
use containerd_client::services::v1::{
    GetImageRequest, InfoRequest, ListImagesRequest, content_client::ContentClient,
    images_client::ImagesClient,
};
use containerd_client::tonic::{Code, Request, transport::Channel};

use flexnode::effects::containerd::{
    BindMount, GrpcContainerd, MANAGED_LABEL, PROGRESS_EVERY, PULLED_BY_LABEL, PullProgress,
    RegistryConfig, StopOutcome, TaskIo,
};
use flexnode::effects::http::Trust;
use flexnode::effects::{Containerd, EffectError};
use flexnode::lifecycle::agent::Sha256Hex;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::containerd::{Flavor, NS, Tier, both_versions, snapshotter};

impl Tier {
    fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    fn blob_json(&self, digest: &str) -> serde_json::Value {
        let bytes = std::fs::read(self.blob_path(digest)).expect("registry blob");
        serde_json::from_slice(&bytes).expect("blob is JSON")
    }

    /// (manifest digest, layer digests, top chainID) computed from the registry's files.
    fn expected_layout(&self, digest: &Sha256Hex) -> (String, Vec<String>, String) {
        let mut manifest_digest = digest.oci();
        let mut manifest = self.blob_json(&manifest_digest);
        if let Some(list) = manifest.get("manifests").and_then(|m| m.as_array()) {
            let amd64 = list
                .iter()
                .find(|m| m["platform"]["architecture"] == "amd64")
                .expect("amd64 entry");
            manifest_digest = amd64["digest"].as_str().expect("digest").to_string();
            manifest = self.blob_json(&manifest_digest);
        }
        let layers = manifest["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().expect("digest").to_string())
            .collect();
        let config = self.blob_json(manifest["config"]["digest"].as_str().expect("config"));
        let mut chain = String::new();
        for diff_id in config["rootfs"]["diff_ids"].as_array().expect("diff_ids") {
            let diff_id = diff_id.as_str().expect("diff id");
            chain = if chain.is_empty() {
                diff_id.to_string()
            } else {
                format!(
                    "sha256:{}",
                    hex::encode(Sha256::digest(format!("{chain} {diff_id}").as_bytes()))
                )
            };
        }
        (manifest_digest, layers, chain)
    }

    fn ctr(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.ctr)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", NS])
            .args(args)
            .output()
            .expect("ctr");
        // stdout only when it worked: ctr 2.x warns on stderr about cgroup v1 every time.
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            text.push_str(&String::from_utf8_lossy(&out.stderr));
        }
        (out.status.success(), text)
    }

    async fn agent(&self) -> GrpcContainerd {
        GrpcContainerd::connect(&self.socket, NS)
            .await
            .expect("connect")
            .with_snapshotter(&snapshotter())
    }

    async fn channel(&self) -> Channel {
        containerd_client::connect(&self.socket)
            .await
            .expect("connect")
    }
}

fn ns<T>(msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("containerd-namespace", NS.parse().expect("ascii"));
    req
}

/// All image records in the namespace: (name, target digest, pulled-by label).
async fn records(ch: &Channel) -> Vec<(String, String, Option<String>)> {
    let mut list: Vec<_> = ImagesClient::new(ch.clone())
        .list(ns(ListImagesRequest { filters: vec![] }))
        .await
        .expect("list images")
        .into_inner()
        .images
        .into_iter()
        .map(|i| {
            (
                i.name,
                i.target.map(|t| t.digest).unwrap_or_default(),
                i.labels.get(PULLED_BY_LABEL).cloned(),
            )
        })
        .collect();
    list.sort();
    list
}

async fn snapshot_exists(ch: &Channel, key: &str) -> bool {
    match SnapshotsClient::new(ch.clone())
        .stat(ns(StatSnapshotRequest {
            snapshotter: snapshotter(),
            key: key.to_string(),
        }))
        .await
    {
        Ok(r) => {
            let info = r.into_inner().info.expect("info");
            assert_eq!(info.name, key);
            true
        }
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("stat snapshot: {s}"),
    }
}

async fn content_exists(ch: &Channel, digest: &str) -> bool {
    match ContentClient::new(ch.clone())
        .info(ns(InfoRequest {
            digest: digest.to_string(),
        }))
        .await
    {
        Ok(_) => true,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("content info: {s}"),
    }
}

fn failed(r: Result<(), EffectError>) -> String {
    match r {
        Err(EffectError::Failed(m)) => m,
        other => panic!("expected a failure, got {other:?}"),
    }
}
