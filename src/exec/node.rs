//! The machines' kubelet side of the executor: a side provisioned from the node image the
//! configuration names for its Kubernetes version (pulled by digest, unpacked, given its
//! kubelet's files), and the wait for that kubelet's Node to be Ready.

use super::{Clock, Runner};
use crate::config::NodeImage;
use crate::effects::{
    Containerd, EffectError, EffectResult, Host, MACHINE_DROP_IN, NodeSeen, Publisher, Systemd,
    machine_unit,
};
use crate::lifecycle::state::Side;
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
    /// `ProvisionMachine`. A tree already provisioned for `version` (from the image named
    /// now, if one is) is done; anything else is built again from the start.
    pub(super) async fn provision_machine(&self, side: Side, version: &str) -> EffectResult {
        let fx = &self.effects;
        let image = self.node_image(version)?;
        let tree = fx.host.machine_rootfs(side).await?;
        let done = tree.as_ref().is_some_and(|t| {
            t.kubernetes_version == version && t.image.as_ref() == image.map(|i| &i.digest)
        });
        if done {
            return Ok(());
        }
        let Some(image) = image else {
            return fx.host.provision_machine(side, version).await;
        };
        if !fx.containerd.image_present(&image.digest).await? {
            tracing::info!(image = %image.pinned(), "pulling the node image");
            fx.containerd
                .pull_content(&image.pinned(), &image.digest)
                .await?;
        }
        let dir = fx.host.clear_machine_tree(side).await?;
        let started = Instant::now();
        tracing::info!(machine = side.name(), image = %image.pinned(), "unpacking the node image");
        fx.containerd.unpack_image_into(&image.digest, &dir).await?;
        tracing::info!(
            machine = side.name(),
            secs = started.elapsed().as_secs(),
            "node image unpacked"
        );
        // Before the marker: a finished tree always has its drop-in (`StartMachine` reloads).
        fx.systemd
            .write_drop_in(&machine_unit(side), MACHINE_DROP_IN)
            .await?;
        fx.host.complete_machine(side, version, &image.digest).await
    }

    /// The configured node image for `version`; `None` when none is configured at all (a
    /// machine without a kubelet). Images configured, but none for `version`: a failure.
    fn node_image(&self, version: &str) -> EffectResult<Option<&NodeImage>> {
        if self.node_images.is_empty() {
            return Ok(None);
        }
        self.node_images.get(version).map(Some).ok_or_else(|| {
            let known: Vec<&str> = self.node_images.keys().map(String::as_str).collect();
            EffectError::Failed(format!(
                "no node image for Kubernetes {version}: the configuration's nodeImages name {}",
                known.join(", ")
            ))
        })
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
