//! The machines' kubelet side of the executor: a side provisioned from the node image the
//! configuration names for its Kubernetes version (pulled by digest, unpacked, given its
//! kubelet's files), and the wait for that kubelet's Node to be Ready.

use super::{Clock, Runner};
use crate::effects::{
    Containerd, EffectError, EffectResult, Host, MACHINE_DROP_IN, NodeSeen, Publisher, Systemd,
    machine_unit,
};
use crate::lifecycle::agent::Sha256Hex;
use crate::lifecycle::kubelet::check_node_settings;
use crate::lifecycle::state::{Goal, Side};
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
            return match done {
                true => Ok(()),
                false => fx.host.provision_machine(side, version).await,
            };
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
            tracing::info!(image = %image.reference, "pulling the node image");
            fx.containerd
                .pull_content(&pull_reference(&image.reference), &digest)
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
    /// 4. the `nodeImage` pattern's tag for the version, resolved to its digest now.
    ///
    /// A version with none fails here, before the running side is touched.
    async fn choose_node_image(&self, side: Side, goal: &Goal) -> EffectResult<MachineImage> {
        let version = goal.kubernetes_version.as_str();
        let store_failed =
            |e: crate::store::StoreError| EffectError::Failed(format!("the store: {e}"));
        let chosen = |reference: String, digest: &str| MachineImage {
            generation: goal.generation,
            kubernetes_version: version.to_string(),
            reference,
            digest: digest.to_string(),
            chosen_at: self.clock.now(),
        };
        let image = if let Some(pin) = self.node_images.pins.get(version) {
            chosen(pin.pinned(), pin.digest.as_str())
        } else if let Some(before) = self
            .store
            .machine_image(side)
            .map_err(store_failed)?
            .filter(|m| m.generation == goal.generation && m.kubernetes_version == version)
        {
            return Ok(before);
        } else if let Some(running) = self.running_image(side.other(), version).await? {
            chosen(running.reference, &running.digest)
        } else {
            let Some(pattern) = &self.node_images.pattern else {
                let known: Vec<&str> = self.node_images.pins.keys().map(String::as_str).collect();
                return Err(EffectError::Failed(format!(
                    "no node image for Kubernetes {version}: the configuration's nodeImages \
                     name {} and it has no nodeImage pattern",
                    known.join(", ")
                )));
            };
            let tagged = pattern.for_version(version);
            let digest = self
                .effects
                .containerd
                .resolve_tag(&tagged)
                .await
                .map_err(|e| {
                    EffectError::Failed(format!("no node image for Kubernetes {version}: {e}"))
                })?;
            tracing::info!(image = %tagged, digest = %digest.oci(), "node image resolved");
            chosen(format!("{tagged}@{}", digest.oci()), digest.as_str())
        };
        self.store
            .record_machine_image(side, &image)
            .map_err(store_failed)?;
        Ok(image)
    }

    /// The image `side` runs if its tree is whole at `version` and unpacked from it.
    async fn running_image(&self, side: Side, version: &str) -> EffectResult<Option<MachineImage>> {
        let Some(image) = self
            .store
            .machine_image(side)
            .map_err(|e| EffectError::Failed(format!("the store: {e}")))?
            .filter(|m| m.kubernetes_version == version)
        else {
            return Ok(None);
        };
        let tree = self.effects.host.machine_rootfs(side).await?;
        Ok(tree
            .filter(|t| t.image.as_ref().is_some_and(|d| d.as_str() == image.digest))
            .map(|_| image))
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

/// What a pull by digest takes of a chosen reference: `registry/repository@sha256:…`, the tag
/// a pattern named left out.
fn pull_reference(chosen: &str) -> String {
    match chosen.rsplit_once('@') {
        Some((name, digest)) => {
            let slash = name.rfind('/').unwrap_or(0);
            let name = match name[slash..].rfind(':') {
                Some(colon) => &name[..slash + colon],
                None => name,
            };
            format!("{name}@{digest}")
        }
        None => chosen.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_chosen_reference_is_pulled_by_its_digest_alone() {
        let d = format!("sha256:{}", "ab".repeat(32));
        for (chosen, pulled) in [
            (
                format!("reg:5000/flexnode/node:v1.34.12@{d}"),
                format!("reg:5000/flexnode/node@{d}"),
            ),
            (
                format!("reg:5000/flexnode/node@{d}"),
                format!("reg:5000/flexnode/node@{d}"),
            ),
            (
                format!("reg.example/node@{d}"),
                format!("reg.example/node@{d}"),
            ),
        ] {
            assert_eq!(super::pull_reference(&chosen), pulled);
        }
    }
}
