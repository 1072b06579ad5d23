//! The simulated API server behind the publisher: status writes, the Node as the running
//! machine's kubelet reports it, its cordon and pods.

use super::host::SimHost;
use super::world::*;
use crate::effects::{EffectResult, Eviction, NodeSeen, Publisher};
use crate::lifecycle::Timestamp;
use crate::lifecycle::drain::{PodFacts, PodOwner};
use crate::lifecycle::result::{MachinePhase, OpResult};
use crate::lifecycle::state::OpRef;

impl Publisher for SimHost {
    async fn report_progress(
        &self,
        op: &OpRef,
        message: &str,
        machine_generation: i64,
        _started_at: Timestamp,
    ) -> EffectResult {
        self.run("report_progress", &op.name, |w| {
            w.api()?;
            w.api.push(ApiWrite::Progress {
                op: op.clone(),
                message: message.to_string(),
                machine_generation,
            });
            Ok(())
        })
    }

    async fn publish_result(&self, op: &OpRef, result: &OpResult, at: Timestamp) -> EffectResult {
        self.run("publish_result", &op.name, |w| {
            w.api()?;
            let write = ApiWrite::Result {
                op: op.clone(),
                result: result.clone(),
                completed_at: at,
            };
            // As on a real API server, writing the status the object already has is no new
            // version: a re-publish after a crash is not a second result.
            let current = w
                .api
                .iter()
                .rev()
                .find(|a| matches!(a, ApiWrite::Result { op: o, .. } if o.uid == op.uid));
            if current != Some(&write) {
                w.api.push(write);
            }
            Ok(())
        })
    }

    /// A kubelet reports its Node Ready as soon as its machine (one from a node image) runs.
    async fn node_seen(&self) -> EffectResult<Option<NodeSeen>> {
        self.read("node_seen", "")?;
        let w = self.world();
        w.api()?;
        let running = w.machines.values().find(|m| m.running && m.image.is_some());
        Ok(running.map(|m| NodeSeen {
            ready: "True".into(),
            reason: "KubeletReady".into(),
            message: String::new(),
            heartbeat: m.started_at,
            boot_id: String::new(),
            kubelet_version: m.kubernetes_version.clone().unwrap_or_default(),
        }))
    }

    async fn report_machine(
        &self,
        phase: MachinePhase,
        message: &str,
        observed_generation: Option<i64>,
    ) -> EffectResult {
        self.run("report_machine", phase.as_str(), |w| {
            w.api()?;
            w.api.push(ApiWrite::Machine {
                phase,
                message: message.to_string(),
                observed_generation,
            });
            Ok(())
        })
    }

    async fn cordon(&self, holder: &str) -> EffectResult<bool> {
        self.run("cordon", holder, |w| {
            w.api()?;
            match w.cordon.as_deref() {
                Some("") => Ok(false),
                Some(_) | None => {
                    w.cordon = Some(holder.to_string());
                    Ok(true)
                }
            }
        })
    }

    async fn uncordon(&self, holder: &str) -> EffectResult<bool> {
        self.run("uncordon", holder, |w| {
            w.api()?;
            // Any mark is the agent's; an unmarked cordon (`""`) is someone else's.
            if w.cordon.as_deref().is_none_or(str::is_empty) {
                return Ok(false);
            }
            w.cordon = None;
            Ok(true)
        })
    }

    async fn pods_on_node(&self) -> EffectResult<Vec<PodFacts>> {
        self.read("pods_on_node", "")?;
        let w = self.world();
        w.api()?;
        Ok(w.pods
            .iter()
            .map(|name| PodFacts {
                name: name.clone(),
                owner: PodOwner::Controller,
                mirror: false,
                finished: false,
                emptydir: false,
                terminating: false,
                labels: Default::default(),
            })
            .collect())
    }

    /// The simulated cluster makes an evicted pod again elsewhere at once.
    async fn budgets_recovering(&self, _pods: &[PodFacts]) -> EffectResult<Vec<String>> {
        self.read("budgets_recovering", "")?;
        self.world().api()?;
        Ok(Vec::new())
    }

    async fn evict(&self, pod: &PodFacts) -> EffectResult<Eviction> {
        self.run("evict", &pod.name, |w| {
            w.api()?;
            let before = w.pods.len();
            w.pods.retain(|p| p != &pod.name);
            if w.pods.len() == before {
                return Ok(Eviction::Gone);
            }
            w.evictions.push(pod.name.clone());
            Ok(Eviction::Evicted)
        })
    }
}
