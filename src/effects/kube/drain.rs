//! What a drain asks of the API server: the Node's cordon (marked with its holder, so only
//! the holder lifts it), the pods bound to the node, and their evictions through the Eviction
//! API, which honours every PodDisruptionBudget.

use super::{KubePublisher, api_error, resend};
use crate::api::selector_matches;
use crate::effects::{EffectResult, Eviction};
use crate::lifecycle::drain::{PodFacts, PodOwner};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;

/// The Node annotation that names who cordoned it for a drain.
pub const CORDON_MARK: &str = "flexnode.io/cordoned-by";
const MIRROR: &str = "kubernetes.io/config.mirror";
const CONFLICT_RETRIES: usize = 5;
/// How long an eviction is waited for. The API server answers one in milliseconds, but a
/// refusal to keep a budget is a 429 with a `Retry-After`, which kube's client resends after
/// that delay, up to 15 times: longer than a drain's pace. An eviction not answered in time is
/// asked again at the drain's next pass (evicting a pod twice is harmless).
const EVICTION_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl KubePublisher {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The Node's `(unschedulable, the drain's mark, resourceVersion)`; `None` without a Node.
    async fn read_cordon(&self) -> EffectResult<Option<(bool, Option<String>, String)>> {
        let nodes = self.nodes();
        let node = resend(|| nodes.get_opt(&self.node))
            .await
            .map_err(api_error)?;
        Ok(node.map(|n| {
            let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            let mark = n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(CORDON_MARK).cloned());
            (
                unschedulable,
                mark,
                n.metadata.resource_version.unwrap_or_default(),
            )
        }))
    }

    /// One merge patch of the cordon and the mark, on the resourceVersion just read: an
    /// operator's cordon between the read and the write is a conflict, read again. Any mark
    /// on this node's Node is this agent's (an earlier drain's whose lift met the API server
    /// away): a new drain takes it over, an uncordon lifts it.
    async fn set_cordon(&self, holder: &str, cordon: bool) -> EffectResult<bool> {
        for _ in 0..CONFLICT_RETRIES {
            let Some((unschedulable, mark, version)) = self.read_cordon().await? else {
                return Ok(false);
            };
            let patch = match (cordon, unschedulable, mark) {
                (true, true, Some(m)) if m == holder => return Ok(true),
                (true, true, Some(_)) => json!({
                    "metadata": {"resourceVersion": version, "annotations": {CORDON_MARK: holder}},
                }),
                // Someone else's cordon (no mark): theirs to lift.
                (true, true, None) => {
                    tracing::info!("the Node is cordoned by someone else; that cordon stays");
                    return Ok(false);
                }
                (true, false, _) => json!({
                    "metadata": {"resourceVersion": version, "annotations": {CORDON_MARK: holder}},
                    "spec": {"unschedulable": true},
                }),
                (false, _, None) => return Ok(false),
                (false, _, Some(_)) => json!({
                    "metadata": {"resourceVersion": version, "annotations": {CORDON_MARK: null}},
                    "spec": {"unschedulable": null},
                }),
            };
            let params = PatchParams {
                field_manager: Some(super::FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            match self
                .nodes()
                .patch(&self.node, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
                Err(e) => return Err(api_error(e)),
            }
        }
        Err(crate::effects::EffectError::Failed(
            "the Node kept changing while its cordon was written".into(),
        ))
    }

    pub(super) async fn cordon_node(&self, holder: &str) -> EffectResult<bool> {
        self.set_cordon(holder, true).await
    }

    pub(super) async fn uncordon_node(&self, holder: &str) -> EffectResult<bool> {
        self.set_cordon(holder, false).await
    }

    pub(super) async fn list_pods(&self) -> EffectResult<Vec<PodFacts>> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        let list = resend(|| pods.list(&on_node)).await.map_err(api_error)?;
        Ok(list.items.iter().map(facts).collect())
    }

    pub(super) async fn evict_pod(&self, pod: &PodFacts) -> EffectResult<Eviction> {
        let Some((namespace, name)) = pod.name.split_once('/') else {
            return Ok(Eviction::Gone);
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = EvictParams::default();
        match tokio::time::timeout(EVICTION_WAIT, pods.evict(name, &params)).await {
            Ok(Ok(_)) => Ok(Eviction::Evicted),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(Eviction::Gone),
            Ok(Err(kube::Error::Api(s))) if s.code == 429 => Ok(Eviction::Blocked {
                budgets: self.blocking_budgets(namespace, pod).await?,
            }),
            Ok(Err(e)) => Err(api_error(e)),
            // Refused and being resent (or the server slow): the budgets say which.
            Err(_) => Ok(Eviction::Blocked {
                budgets: self.blocking_budgets(namespace, pod).await?,
            }),
        }
    }

    /// The budgets in `namespace` that select `pod` and allow no disruption now.
    async fn blocking_budgets(&self, namespace: &str, pod: &PodFacts) -> EffectResult<Vec<String>> {
        Ok(self
            .budgets(namespace)
            .await?
            .iter()
            .filter(|b| selects(b, pod))
            .filter(|b| b.status.as_ref().map_or(0, |s| s.disruptions_allowed) < 1)
            .map(|b| budget_name(namespace, b))
            .collect())
    }

    pub(super) async fn recovering_budgets(&self, pods: &[PodFacts]) -> EffectResult<Vec<String>> {
        let mut namespaces: Vec<&str> = pods
            .iter()
            .filter_map(|p| p.name.split_once('/').map(|(ns, _)| ns))
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let mut recovering = Vec::new();
        for namespace in namespaces {
            for b in self.budgets(namespace).await? {
                let Some(status) = &b.status else { continue };
                if status.current_healthy < status.expected_pods
                    && pods.iter().any(|p| selects(&b, p))
                {
                    recovering.push(format!(
                        "{} ({} of {} healthy)",
                        budget_name(namespace, &b),
                        status.current_healthy,
                        status.expected_pods
                    ));
                }
            }
        }
        Ok(recovering)
    }

    async fn budgets(&self, namespace: &str) -> EffectResult<Vec<PodDisruptionBudget>> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let all = ListParams::default();
        Ok(resend(|| api.list(&all)).await.map_err(api_error)?.items)
    }
}

fn selects(budget: &PodDisruptionBudget, pod: &PodFacts) -> bool {
    let in_namespace = pod
        .name
        .split_once('/')
        .is_some_and(|(ns, _)| Some(ns) == budget.metadata.namespace.as_deref());
    in_namespace
        && budget
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|sel| selector_matches(sel, &pod.labels))
}

fn budget_name(namespace: &str, budget: &PodDisruptionBudget) -> String {
    format!(
        "{namespace}/{}",
        budget.metadata.name.as_deref().unwrap_or_default()
    )
}

fn facts(pod: &Pod) -> PodFacts {
    let meta = &pod.metadata;
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map_or(PodOwner::None, |o| match o.kind.as_str() {
            "DaemonSet" => PodOwner::DaemonSet,
            _ => PodOwner::Controller,
        });
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodFacts {
        name: format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or_default()
        ),
        owner,
        mirror: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR)),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        emptydir: pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|v| v.iter().any(|v| v.empty_dir.is_some())),
        terminating: meta.deletion_timestamp.is_some(),
        labels: meta.labels.clone().unwrap_or_default(),
    }
}
