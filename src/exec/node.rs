//! The machines' kubelet side of the executor: a side provisioned from the node image the
//! configuration names for its Kubernetes version (pulled by digest, unpacked, given its
//! kubelet's files), and the wait for that kubelet's Node to be Ready.

use super::apply::store_failed;
use super::{Clock, Runner};
use crate::effects::{
    Containerd, EffectError, EffectResult, Host, MACHINE_DROP_IN, NodeSeen, Publisher, Systemd,
    machine_unit,
};
use crate::lifecycle::agent::{ImageRef, Sha256Hex};
use crate::lifecycle::kubelet::check_node_settings;
use crate::lifecycle::state::{Goal, Side};
use crate::lifecycle::validate::{is_kubernetes_version, parse_pinned_image};
use crate::store::MachineImage;
use std::time::Duration;
// Tokio's monotonic clock: a paused test runtime (the crash simulation's) lets a wait of
// minutes pass at once.
use tokio::time::Instant;

/// How long a started machine's kubelet has to report its Node Ready.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(600);
const NODE_POLL: Duration = Duration::from_secs(2);
/// A wait with no change is still reported this often.
const NODE_PROGRESS_EVERY: Duration = Duration::from_secs(30);

impl<S, C, H, P, K> Runner<S, C, H, P, K>
where
    S: Systemd,
    C: Containerd,
    H: Host,
    P: Publisher,
    K: Clock,
{
    /// `ProvisionMachine`. A tree already provisioned for the goal from the image chosen for
    /// it is done; anything else is built again from the start. Without node images the tree
    /// is the minimal one.
    pub(super) async fn provision_machine(&self, side: Side, goal: &Goal) -> EffectResult {
        let fx = &self.effects;
        let version = goal.kubernetes_version.as_str();
        if self.node_images.is_empty() {
            let done = fx
                .host
                .machine_rootfs(side)
                .await?
                .is_some_and(|t| t.kubernetes_version == version && t.image.is_none());
            if done {
                return Ok(());
            }
            return fx.host.provision_machine(side, version).await;
        }
        // Before anything is fetched: the Machine's labels and taints as a kubelet takes them.
        check_node_settings(&goal.node)
            .map_err(|m| EffectError::Failed(format!("the Machine's {m}")))?;
        let image = self.choose_node_image(side, goal).await?;
        let digest = Sha256Hex::parse(&image.digest).ok_or_else(|| {
            EffectError::Failed(format!("the store's image for {}: bad digest", side.name()))
        })?;
        let done = fx.host.machine_rootfs(side).await?.is_some_and(|t| {
            t.kubernetes_version == version
                && t.image.as_ref() == Some(&digest)
                && t.generation == Some(goal.generation)
        });
        if done {
            return Ok(());
        }
        if !fx.containerd.image_present(&digest).await? {
            let archive = self.node_images.archive_for(version);
            tracing::info!(image = %image.reference, archive = ?archive, "pulling the node image");
            fx.containerd
                .pull_content(
                    &pull_reference(&image.reference, &digest)?,
                    &digest,
                    archive.as_deref(),
                )
                .await?;
        }
        let dir = fx.host.clear_machine_tree(side).await?;
        let started = Instant::now();
        tracing::info!(machine = side.name(), image = %image.reference, "unpacking the node image");
        fx.containerd.unpack_image_into(&digest, &dir).await?;
        tracing::info!(
            machine = side.name(),
            secs = started.elapsed().as_secs(),
            "node image unpacked"
        );
        // Before the marker: a finished tree always has its drop-in (`StartMachine` reloads).
        fx.systemd
            .write_drop_in(&machine_unit(side), MACHINE_DROP_IN)
            .await?;
        fx.host.complete_machine(side, goal, &digest).await
    }

    /// The node image for `goal` on `side`, recorded before anything is pulled (so a resumed
    /// provisioning takes the same bytes):
    /// 1. the `nodeImages` pin of the version, which wins;
    /// 2. the image this side was given for this very goal before (a provisioning resumed, a
    ///    repave tried again);
    /// 3. the running side's image when the version is unchanged (new labels, the same
    ///    bytes: a tag that moved never changes a node whose version did not);
    /// 4. the `nodeImage` pattern's tag for the version, resolved to its digest now (in the
    ///    version's `nodeImageArchive` where that exists, so an offline node asks no registry).
    ///
    /// A version with none fails here, before the running side is touched.
    async fn choose_node_image(&self, side: Side, goal: &Goal) -> EffectResult<MachineImage> {
        let version = goal.kubernetes_version.as_str();
        if !is_kubernetes_version(version) {
            return Err(EffectError::Failed(format!(
                "the Machine's spec.kubernetes.version {version:?} is not a version like v1.34.12"
            )));
        }
        // (reference, digest)
        let pattern = self.node_images.pattern.as_ref();
        let (reference, digest) = if let Some(pin) = self.node_images.pins.get(version) {
            (pin.pinned(), pin.digest.clone())
        } else if let Some(before) = self
            .store
            .machine_image(side)
            .map_err(store_failed)?
            .filter(|m| m.generation == goal.generation && m.kubernetes_version == version)
        {
            return Ok(before);
        } else if let Some(running) = self.running_image(side.other(), version).await? {
            running
        } else {
            let Some(tagged) = pattern.and_then(|p| p.for_version(version)) else {
                let known: Vec<&str> = self.node_images.pins.keys().map(String::as_str).collect();
                return Err(EffectError::Failed(format!(
                    "no node image for Kubernetes {version}: the configuration's nodeImages \
                     name {} and it has no nodeImage pattern",
                    known.join(", ")
                )));
            };
            let digest = self
                .effects
                .containerd
                .resolve_tag(&tagged, self.node_images.archive_for(version).as_deref())
                .await
                .map_err(|e| {
                    EffectError::Failed(format!("no node image for Kubernetes {version}: {e}"))
                })?;
            tracing::info!(image = %tagged, digest = %digest.oci(), "node image resolved");
            (reference_of(&tagged, &digest), digest)
        };
        let image = MachineImage {
            generation: goal.generation,
            kubernetes_version: version.to_string(),
            reference,
            digest: digest.as_str().to_string(),
            chosen_at: self.clock.now(),
        };
        self.store
            .record_machine_image(side, &image)
            .map_err(store_failed)?;
        Ok(image)
    }

    /// The image `side` runs, if its whole tree is at `version`: by its marker, named as the
    /// store recorded it, or (a tree provisioned before the store recorded images) in the
    /// pattern's repository.
    async fn running_image(
        &self,
        side: Side,
        version: &str,
    ) -> EffectResult<Option<(String, Sha256Hex)>> {
        let tree = self.effects.host.machine_rootfs(side).await?;
        let Some(digest) = tree
            .filter(|t| t.kubernetes_version == version)
            .and_then(|t| t.image)
        else {
            return Ok(None);
        };
        let recorded = self
            .store
            .machine_image(side)
            .map_err(store_failed)?
            .filter(|m| m.digest == digest.as_str());
        let reference = match (recorded, self.node_images.pattern.as_ref()) {
            (Some(m), _) => m.reference,
            (None, Some(p)) => match p.for_version(version) {
                Some(tagged) => reference_of(&tagged, &digest),
                None => return Ok(None),
            },
            (None, None) => return Ok(None),
        };
        Ok(Some((reference, digest)))
    }

    /// `RemoveMachine`'s last part: the machine unit's drop-in.
    pub(super) async fn remove_machine_drop_in(&self, side: Side) -> EffectResult {
        if self
            .effects
            .systemd
            .remove_drop_in(&machine_unit(side))
            .await?
        {
            self.effects.systemd.daemon_reload().await?;
        }
        Ok(())
    }

    /// `AwaitNode`: the Node `Ready` as reported since the side's machine last started, with
    /// progress in the log (a join's terminal) at each change. A tree without a kubelet has
    /// nothing to wait for.
    pub(super) async fn await_node(&self, side: Side) -> EffectResult {
        let fx = &self.effects;
        let runs_kubelet = fx
            .host
            .machine_rootfs(side)
            .await?
            .is_some_and(|t| t.image.is_some());
        if !runs_kubelet {
            tracing::info!(
                machine = side.name(),
                "the machine has no kubelet (no node image): no Node to wait for"
            );
            return Ok(());
        }
        let status = fx.systemd.machine_status(side).await?;
        let since = match (status.running, status.started_at) {
            (true, Some(t)) => t,
            _ => {
                return Err(EffectError::Failed(format!(
                    "machine {} is not running: its kubelet cannot report the Node",
                    side.name()
                )));
            }
        };
        let started = Instant::now();
        let mut last: Option<NodeSeen> = None;
        let mut reported = Instant::now();
        loop {
            let seen = match fx.publisher.node_seen().await {
                Ok(seen) => seen,
                // The API server may be restarting; the deadline decides.
                Err(EffectError::Failed(e)) => {
                    tracing::warn!(error = %e, "reading the Node");
                    last.clone()
                }
                Err(e) => return Err(e),
            };
            if let Some(s) = &seen {
                self.remember_node(s);
                if s.ready_since(since) {
                    tracing::info!(
                        machine = side.name(),
                        kubelet = %s.kubelet_version,
                        secs = started.elapsed().as_secs(),
                        "the Node is Ready"
                    );
                    return Ok(());
                }
            }
            if seen != last || reported.elapsed() >= NODE_PROGRESS_EVERY {
                tracing::info!(
                    machine = side.name(),
                    waited = started.elapsed().as_secs(),
                    node = %describe(seen.as_ref()),
                    "waiting for the kubelet to report the Node Ready"
                );
                reported = Instant::now();
            }
            if started.elapsed() >= NODE_READY_TIMEOUT {
                return Err(EffectError::Failed(format!(
                    "the Node did not become Ready within {} s of machine {} starting ({}); \
                     see `machinectl shell {} /usr/bin/journalctl -u kubelet`",
                    NODE_READY_TIMEOUT.as_secs(),
                    side.name(),
                    describe(seen.as_ref()),
                    side.name()
                )));
            }
            last = seen;
            self.alive();
            tokio::time::sleep(NODE_POLL).await;
        }
    }

    /// What `flexnode status` shows; a store that cannot take it costs only that.
    pub fn remember_node(&self, seen: &NodeSeen) {
        let recorded = serde_json::to_string(seen)
            .map_err(|e| e.to_string())
            .and_then(|json| {
                self.store
                    .record_node_seen(&json, self.clock.now())
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "the Node's readiness not recorded");
        }
    }
}

fn describe(seen: Option<&NodeSeen>) -> String {
    match seen {
        None => "no Node registered yet".into(),
        Some(s) if s.reason.is_empty() => format!("Ready={}", s.ready),
        Some(s) => format!("Ready={} ({})", s.ready, s.reason),
    }
}

/// `registry/repository:tag@sha256:…`: what a resolved tag is recorded and shown as.
fn reference_of(tagged: &ImageRef, digest: &Sha256Hex) -> String {
    let tag = tagged
        .tag
        .as_deref()
        .map(|t| format!(":{t}"))
        .unwrap_or_default();
    format!(
        "{}/{}{tag}@{}",
        tagged.registry,
        tagged.repository,
        digest.oci()
    )
}

/// What a pull by digest takes of a recorded reference: `registry/repository@sha256:…`.
fn pull_reference(recorded: &str, digest: &Sha256Hex) -> EffectResult<String> {
    parse_pinned_image(recorded)
        .map(|(image, _)| image.pinned(digest))
        .map_err(|_| {
            EffectError::Failed(format!(
                "the store's node image {recorded:?} is not a reference"
            ))
        })
}

#[cfg(test)]
mod tests {
    use crate::lifecycle::agent::{ImageRef, Sha256Hex};

    #[test]
    fn a_resolved_tag_is_recorded_with_it_and_pulled_by_its_digest_alone() {
        let d = Sha256Hex::parse(&"ab".repeat(32)).expect("digest");
        let tagged = ImageRef {
            registry: "reg:5000".into(),
            repository: "flexnode/node".into(),
            tag: Some("v1.34.12".into()),
        };
        let recorded = super::reference_of(&tagged, &d);
        assert_eq!(
            recorded,
            format!("reg:5000/flexnode/node:v1.34.12@{}", d.oci())
        );
        assert_eq!(
            super::pull_reference(&recorded, &d),
            Ok(format!("reg:5000/flexnode/node@{}", d.oci()))
        );
        assert!(super::pull_reference("not a reference", &d).is_err());
    }
}
