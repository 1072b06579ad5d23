//! One status model: built from the store, rendered by `flexnode status` (and, in later
//! issues, resource status, Events and metrics).

use crate::effects::NodeSeen;
use crate::lifecycle::fault::Problem;
use crate::lifecycle::state::Goal;
use crate::store::{JournalEntry, StoreError, StoreReader};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Bumped on any incompatible change of the JSON/YAML shape.
pub const STATUS_API_VERSION: &str = "flexnode.io/v1alpha1";
pub const STATUS_KIND: &str = "NodeStatus";
pub const HISTORY_KIND: &str = "NodeHistory";

/// `flexnode history -o json|yaml`: the newest journal entries, oldest first, under the same
/// versioned envelope as the status.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub entries: Vec<JournalEntry>,
}

impl HistoryReport {
    pub fn new(entries: Vec<JournalEntry>) -> Self {
        Self {
            api_version: STATUS_API_VERSION,
            kind: HISTORY_KIND,
            entries,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub phase: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeSummary>,
    /// The `Node` as the agent last saw it (the kubelet's report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_operation: Option<OperationSummary>,
    /// The drain under way, or the cordon it left to lift (src/store/cordon.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSummary>,
    /// Effects of a step that a crash interrupted; the next agent process finishes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interrupted_effects: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_result: Option<ResultSummary>,
    pub recent_transitions: Vec<JournalEntry>,
    /// What is wrong around the node that keeps the agent from working, and what to do
    /// (src/lifecycle/fault.rs); `flexnode status` fills it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<Problem>,
    /// What the running daemon says over its socket (`src/reconcile/status_socket.rs`); `None`: no
    /// daemon answered, and the report is the store's alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonSummary>,
}

/// What only the running daemon knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSummary {
    pub pid: u32,
    /// systemd's STATUS as the daemon last set it.
    pub status_text: String,
    /// Every watch has listed once.
    pub watches_synced: bool,
    /// No watch is interrupted (the API server answers).
    pub watches_connected: bool,
    /// The Machine's goal when the node has not applied it yet (older daemons: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_goal: Option<GoalSummary>,
}

/// A Machine goal: what a repave applies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoalSummary {
    pub generation: i64,
    pub kubernetes_version: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<String>,
}

impl GoalSummary {
    pub fn of(goal: &Goal) -> Self {
        Self {
            generation: goal.generation,
            kubernetes_version: goal.kubernetes_version.clone(),
            node_labels: goal.node.labels.clone(),
            register_with_taints: goal.node.taints.clone(),
        }
    }
}

impl StatusReport {
    /// A node whose store cannot be read: nothing about it is known.
    pub fn unknown() -> Self {
        Self {
            api_version: STATUS_API_VERSION,
            kind: STATUS_KIND,
            phase: "Unknown",
            step: None,
            deadline: None,
            node: None,
            kubelet: None,
            current_operation: None,
            drain: None,
            interrupted_effects: Vec::new(),
            last_result: None,
            recent_transitions: Vec::new(),
            problems: Vec::new(),
            daemon: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    pub install_mode: &'static str,
    pub active_side: &'static str,
    pub applied_generation: i64,
    pub applied_kubernetes_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_kubernetes_version: Option<String>,
    /// The active side's node image as chosen (`registry/repository[:tag]@sha256:…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_image: Option<String>,
    /// The applied goal's labels and taints: the Node registered with them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub register_with_taints: Vec<String>,
    pub agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_good_agent: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletSummary {
    #[serde(flatten)]
    pub node: NodeSeen,
    pub seen_at: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationSummary {
    pub name: String,
    pub uid: String,
    pub started_at: String,
    pub deadline: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultSummary {
    pub operation: String,
    pub phase: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub completed_at: String,
    pub published: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainSummary {
    /// `operation/<uid>`, `repave/<generation>` or `deletion-signal`.
    pub holder: String,
    /// The Node carries the agent's cordon (false: not yet, or someone else's cordon).
    pub cordoned_by_agent: bool,
    pub since: String,
    pub progress: String,
}

pub fn build(reader: &StoreReader) -> Result<StatusReport, StoreError> {
    let persisted = reader.load()?;
    let state = &persisted.state;
    let node = match state.node() {
        None => None,
        Some(n) => Some(NodeSummary {
            name: n.name.clone(),
            install_mode: n.mode.as_str(),
            active_side: n.active.name(),
            applied_generation: n.applied.generation,
            applied_kubernetes_version: n.applied.kubernetes_version.clone(),
            previous_kubernetes_version: n.previous.as_ref().map(|g| g.kubernetes_version.clone()),
            node_image: reader.machine_image(n.active)?.map(|m| m.reference),
            node_labels: n.applied.node.labels.clone(),
            register_with_taints: n.applied.node.taints.clone(),
            agent: n.agent.to_string(),
            last_good_agent: n.last_good.as_ref().map(ToString::to_string),
        }),
    };
    // A record this build cannot read is left out, not an error: status must always work.
    let kubelet = reader.node_seen()?.and_then(|(json, at)| {
        serde_json::from_str::<NodeSeen>(&json)
            .ok()
            .map(|node| KubeletSummary {
                node,
                seen_at: at.rfc3339(),
            })
    });
    let current_operation = state.run().map(|r| OperationSummary {
        name: r.op.name.clone(),
        uid: r.op.uid.clone(),
        started_at: r.started_at.rfc3339(),
        deadline: r.deadline.rfc3339(),
    });
    let last_result = reader.last_result()?.map(|r| ResultSummary {
        operation: r.op.name,
        phase: r.result.reason.phase(),
        reason: r.result.reason.as_str(),
        message: r.result.message,
        completed_at: r.completed_at.rfc3339(),
        published: r.published_at.is_some(),
    });
    Ok(StatusReport {
        api_version: STATUS_API_VERSION,
        kind: STATUS_KIND,
        phase: state.phase_name(),
        step: state.step_name(),
        deadline: state.deadline().map(|d| d.rfc3339()),
        node,
        kubelet,
        current_operation,
        drain: reader.cordon()?.map(|c| DrainSummary {
            holder: c.holder,
            cordoned_by_agent: c.cordoned,
            since: c.since.rfc3339(),
            progress: c.progress,
        }),
        interrupted_effects: persisted
            .pending
            .map(|i| i.effects.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        last_result,
        recent_transitions: reader.journal(5)?,
        problems: Vec::new(),
        daemon: None,
    })
}

/// The summary a person reads.
pub fn render_human(r: &StatusReport) -> String {
    let mut out = String::new();
    source(&mut out, r);
    for p in &r.problems {
        let _ = writeln!(out, "Problem:          {}: {}", p.reason, p.message);
        let _ = writeln!(out, "What to do:       {}", p.remedy);
    }
    if r.phase == "Unknown" {
        let _ = writeln!(out, "Phase:            Unknown (the store cannot be read)");
        return out;
    }
    let phase = match r.step {
        Some(step) => format!("{} ({step})", r.phase),
        None => r.phase.to_string(),
    };
    let _ = writeln!(out, "Phase:            {phase}");
    if let Some(d) = &r.deadline {
        let _ = writeln!(out, "Deadline:         {d}");
    }
    node(&mut out, r);
    kubelet(&mut out, r);
    if let Some(d) = &r.drain {
        let cordon = if d.cordoned_by_agent {
            "the Node cordoned by the agent"
        } else {
            "not cordoned by the agent"
        };
        let progress = if d.progress.is_empty() {
            "starting"
        } else {
            &d.progress
        };
        let _ = writeln!(
            out,
            "Drain:            {} since {} ({cordon}): {progress}",
            d.holder, d.since
        );
    }
    operations(&mut out, r);
    let _ = writeln!(out, "Recent transitions:");
    if r.recent_transitions.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for e in &r.recent_transitions {
        let _ = writeln!(out, "  {}", journal_line(e));
    }
    out
}

/// Where the report comes from: the store, and the daemon when it answers.
fn source(out: &mut String, r: &StatusReport) {
    match &r.daemon {
        Some(d) => {
            let _ = writeln!(
                out,
                "Source:           the store and the running daemon (pid {})",
                d.pid
            );
            let watches = match (d.watches_synced, d.watches_connected) {
                (_, false) => "interrupted (the API server does not answer)",
                (false, true) => "listing",
                (true, true) => "connected",
            };
            let _ = writeln!(
                out,
                "Daemon:           watches {watches}; {}",
                d.status_text
            );
        }
        None => {
            let _ = writeln!(out, "Source:           the store (no daemon answers)");
        }
    }
}

/// The node as joined: its side, versions and agent.
fn node(out: &mut String, r: &StatusReport) {
    match &r.node {
        Some(n) => {
            let _ = writeln!(
                out,
                "Node:             {} ({} install)",
                n.name, n.install_mode
            );
            let _ = writeln!(out, "Active side:      {}", n.active_side);
            let _ = writeln!(
                out,
                "Applied:          Kubernetes {} (Machine generation {})",
                n.applied_kubernetes_version, n.applied_generation
            );
            if let Some(p) = &n.previous_kubernetes_version {
                let _ = writeln!(out, "Previous:         Kubernetes {p}");
            }
            if let Some(i) = &n.node_image {
                let _ = writeln!(out, "Node image:       {i}");
            }
            settings(out, &n.node_labels, &n.register_with_taints, "");
            if let Some(g) = r.daemon.as_ref().and_then(|d| d.waiting_goal.as_ref()) {
                let _ = writeln!(
                    out,
                    "Waiting:          Kubernetes {} (Machine generation {}), applied by a \
                     repave once the Node is deleted",
                    g.kubernetes_version, g.generation
                );
                settings(out, &g.node_labels, &g.register_with_taints, " (waiting)");
            }
            let _ = writeln!(
                out,
                "Agent:            {}{}",
                n.agent,
                n.last_good_agent
                    .as_ref()
                    .map(|l| format!(" (last good: {l})"))
                    .unwrap_or_default()
            );
        }
        None => {
            let _ = writeln!(out, "Node:             not joined");
        }
    }
}

/// A goal's labels and taints, one line each when there are any.
fn settings(out: &mut String, labels: &BTreeMap<String, String>, taints: &[String], note: &str) {
    if !labels.is_empty() {
        let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(out, "{:<18}{}", format!("Labels{note}:"), pairs.join(", "));
    }
    if !taints.is_empty() {
        let _ = writeln!(out, "{:<18}{}", format!("Taints{note}:"), taints.join(", "));
    }
}

/// The kubelet's Node as last seen.
fn kubelet(out: &mut String, r: &StatusReport) {
    if let Some(k) = &r.kubelet {
        let n = &k.node;
        let reason = if n.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", n.reason)
        };
        let version = if n.kubelet_version.is_empty() {
            String::new()
        } else {
            format!(", kubelet {}", n.kubelet_version)
        };
        let _ = writeln!(
            out,
            "Kubelet:          Ready={}{reason}{version} (seen {})",
            n.ready, k.seen_at
        );
    }
}

/// The operation under way, effects a crash interrupted, the last result.
fn operations(out: &mut String, r: &StatusReport) {
    match &r.current_operation {
        Some(op) => {
            let _ = writeln!(
                out,
                "Operation:        {} (started {}, deadline {})",
                op.name, op.started_at, op.deadline
            );
        }
        None => {
            let _ = writeln!(out, "Operation:        none");
        }
    }
    if !r.interrupted_effects.is_empty() {
        let _ = writeln!(
            out,
            "Interrupted:      {} (finished by the next agent start)",
            r.interrupted_effects.join(", ")
        );
    }
    if let Some(res) = &r.last_result {
        let _ = writeln!(
            out,
            "Last result:      {} {}/{}: {} ({}{})",
            res.operation,
            res.phase,
            res.reason,
            res.message,
            res.completed_at,
            if res.published {
                ""
            } else {
                ", not yet published"
            }
        );
    }
}

pub fn journal_line(e: &JournalEntry) -> String {
    let effects = if e.effects.is_empty() {
        String::new()
    } else {
        format!(" [{}]", e.effects.join(", "))
    };
    format!(
        "#{} {} {} --{}--> {}{} => {}",
        e.seq,
        e.at.rfc3339(),
        e.from,
        e.input,
        e.to,
        effects,
        e.outcome.as_deref().unwrap_or("interrupted")
    )
}
