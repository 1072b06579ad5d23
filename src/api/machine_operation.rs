//! `MachineOperation`: an imperative, one-shot node operation. Every field of the upstream
//! schema is here with its type (`tests/core/upstream_crds.rs` checks it).
// kube's derive repeats `type_` per printer column, which this lint misreads.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha3",
    kind = "MachineOperation",
    shortname = "mop",
    status = "MachineOperationStatus",
    printcolumn(name = "Machine", type_ = "string", json_path = ".spec.machineRef"),
    printcolumn(
        name = "Operation",
        type_ = "string",
        json_path = ".spec.operationKind"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    selectable = ".spec.machineRef",
    selectable = ".spec.operationKind"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationSpec {
    /// Name of the target machine (= the Kubernetes Node name). Either this or
    /// `machineSelector` must be set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<String>,
    /// Label selector, evaluated against the Node's labels (or the Machine's when the Node
    /// does not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_selector: Option<LabelSelector>,
    pub operation_kind: OperationKind,
    /// Kind-specific parameters; AgentUpgrade uses `downloadURL` and `sha256`. Sensitive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
    /// Delete the object this many seconds after it finished. Unset keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OperationKind {
    #[default]
    NodeReboot,
    AgentUpgrade,
    AgentReset,
    HostReboot,
    HostPowerOff,
    HostPowerOn,
    HostReplace,
    /// A kind this version does not know (a newer upstream CRD): left untouched, never a
    /// reason to fail the whole watch.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

impl OperationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodeReboot => "NodeReboot",
            Self::AgentUpgrade => "AgentUpgrade",
            Self::AgentReset => "AgentReset",
            Self::HostReboot => "HostReboot",
            Self::HostPowerOff => "HostPowerOff",
            Self::HostPowerOn => "HostPowerOn",
            Self::HostReplace => "HostReplace",
            Self::Unknown => "Unknown",
        }
    }
}

/// The schema is a plain string, as upstream's: a phase this version does not know (another
/// controller's) is [`OperationPhase::Unknown`], never an operation that cannot be read.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum OperationPhase {
    Pending,
    InProgress,
    Complete,
    Failed,
    #[serde(other)]
    Unknown,
}

impl OperationPhase {
    /// `Complete` or `Failed`: the operation runs no more.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}

impl MachineOperation {
    /// Whether its status shows a terminal phase ([`OperationPhase::is_terminal`]).
    pub fn is_terminal(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(OperationPhase::is_terminal)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::string")]
    pub phase: Option<OperationPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_machine_generation: Option<i64>,
    /// Per-target records of controller-driven operations; never written by the node agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["machineRef"]))]
    pub targets: Option<Vec<OperationTarget>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationTarget {
    pub machine_ref: String,
    /// The controller's words (`Pending`, `InProgress`, …); never interpreted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The controller's stage (`PoweringOff`, `WaitingOn`, …); never interpreted here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}
