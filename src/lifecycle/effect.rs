//! Effects are data: the core says what should happen, the executor makes it happen.

use super::state::{Goal, OpRef, OpRun, Side};

use super::agent::UpgradeTarget;
use super::agent::{AgentBuild, InstallMode};
use super::drain::DrainPolicy;
use super::result::{MachinePhase, OpResult};
use super::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "effect", rename_all = "camelCase")]
pub enum Effect {
    /// MachineOperation → `InProgress` (never overwrites `startedAt`).
    ReportProgress {
        op: OpRef,
        message: String,
        /// The Machine generation the operation runs against (0 = no Machine). Older
        /// journals lack both fields.
        #[serde(default)]
        machine_generation: i64,
        /// When the operation was claimed: its `startedAt`.
        #[serde(default)]
        started_at: Timestamp,
    },
    /// Persist the terminal result, then publish it (outbox: re-published, never re-executed).
    PublishResult {
        op: OpRef,
        result: OpResult,
    },
    /// Succeeds once the result of `op` has reached the API server.
    AwaitPublished {
        op: OpRef,
    },
    /// The node's Machine status.
    ReportMachine {
        phase: MachinePhase,
        message: String,
        observed_generation: Option<i64>,
    },
    /// Join: place the running build as the first agent (slots and links, or image selection).
    InstallAgent {
        mode: InstallMode,
        build: AgentBuild,
    },
    /// Write the agent's units (dependencies first) and reload systemd.
    WriteUnits {
        mode: InstallMode,
    },
    /// Swap off for good, as the kubelet needs: every swap unit stopped and masked, swap
    /// lines in the host's `/etc/fstab` commented out (both survive a reboot).
    DisableSwap,
    /// Enable and start the agent service.
    StartAgent,
    /// Fetch, verify and install the candidate; run its `version`.
    StageAgent {
        target: UpgradeTarget,
        candidate: AgentBuild,
    },
    /// Remove a staged candidate that will not run.
    DiscardCandidate {
        candidate: AgentBuild,
    },
    /// Select `to` as the agent (host: `current` link; container: image selection), keeping
    /// `last_good` as the fallback.
    SwitchAgent {
        mode: InstallMode,
        to: AgentBuild,
        last_good: AgentBuild,
    },
    /// A transient timer restarts the agent unit after `delay_ms` (a direct self-restart
    /// would kill the caller).
    ScheduleAgentRestart {
        delay_ms: u64,
    },
    /// Reset the agent unit's failure state and restart it now (recovery path).
    RestartAgent,
    /// Build the rootfs of a side for a goal: its Kubernetes version, and the Node's labels
    /// and taints (older journals name the version alone).
    ProvisionMachine {
        side: Side,
        #[serde(flatten)]
        goal: Goal,
    },
    StartMachine {
        side: Side,
    },
    /// Wait for the side's kubelet: the Node `Ready`, reported since the machine last started
    /// (nothing to wait for in a tree without a kubelet).
    AwaitNode {
        side: Side,
    },
    StopMachine {
        side: Side,
    },
    /// Restart a side; already done if the machine started at or after `not_before`.
    RestartMachine {
        side: Side,
        not_before: Timestamp,
    },
    RemoveMachine {
        side: Side,
    },
    /// Cordon the Node for `holder` (unless someone else has cordoned it: then the cordon is
    /// theirs and stays) and evict its pods through the Eviction API, honouring every
    /// PodDisruptionBudget, until none is left or `until`. Progress goes to `run`'s status
    /// (the Machine's without one) and to `flexnode status`.
    Drain {
        run: Option<OpRun>,
        holder: String,
        policy: DrainPolicy,
        until: Timestamp,
    },
    /// Lift the cordon a drain placed, if the store records one and the Node still carries
    /// its holder's mark; nothing otherwise (an operator's cordon is never lifted).
    Uncordon,
    /// Stop and remove both sides and the node's runtime files; keeps the agent install.
    WipeNode,
    /// Stop, disable and remove the agent's units and links. Stops this daemon.
    UninstallAgent,
}

impl Effect {
    /// Effects that disrupt the node or the agent: never emitted twice for one operation.
    pub fn is_disruptive(&self) -> bool {
        match self {
            Self::SwitchAgent { .. }
            | Self::ScheduleAgentRestart { .. }
            | Self::RestartAgent
            | Self::StopMachine { .. }
            | Self::RestartMachine { .. }
            | Self::RemoveMachine { .. }
            | Self::WipeNode
            | Self::UninstallAgent => true,
            Self::ReportProgress { .. }
            | Self::PublishResult { .. }
            | Self::AwaitPublished { .. }
            | Self::ReportMachine { .. }
            | Self::InstallAgent { .. }
            | Self::WriteUnits { .. }
            | Self::DisableSwap
            | Self::StartAgent
            | Self::StageAgent { .. }
            | Self::DiscardCandidate { .. }
            | Self::ProvisionMachine { .. }
            | Self::StartMachine { .. }
            | Self::AwaitNode { .. }
            | Self::Drain { .. }
            | Self::Uncordon => false,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::ReportProgress { .. } => "ReportProgress",
            Self::PublishResult { .. } => "PublishResult",
            Self::AwaitPublished { .. } => "AwaitPublished",
            Self::ReportMachine { .. } => "ReportMachine",
            Self::InstallAgent { .. } => "InstallAgent",
            Self::WriteUnits { .. } => "WriteUnits",
            Self::DisableSwap => "DisableSwap",
            Self::StartAgent => "StartAgent",
            Self::StageAgent { .. } => "StageAgent",
            Self::DiscardCandidate { .. } => "DiscardCandidate",
            Self::SwitchAgent { .. } => "SwitchAgent",
            Self::ScheduleAgentRestart { .. } => "ScheduleAgentRestart",
            Self::RestartAgent => "RestartAgent",
            Self::ProvisionMachine { .. } => "ProvisionMachine",
            Self::StartMachine { .. } => "StartMachine",
            Self::AwaitNode { .. } => "AwaitNode",
            Self::StopMachine { .. } => "StopMachine",
            Self::RestartMachine { .. } => "RestartMachine",
            Self::RemoveMachine { .. } => "RemoveMachine",
            Self::Drain { .. } => "Drain",
            Self::Uncordon => "Uncordon",
            Self::WipeNode => "WipeNode",
            Self::UninstallAgent => "UninstallAgent",
        }
    }
}

/// One line for the journal and logs; targets render redacted.
impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            Self::ReportProgress { op, .. } | Self::AwaitPublished { op } => write!(f, "({op})"),
            Self::PublishResult { op, result } => {
                write!(f, "({op} {})", result.reason.as_str())
            }
            Self::ReportMachine { phase, .. } => write!(f, "({})", phase.as_str()),
            Self::InstallAgent { build, .. } => write!(f, "({build})"),
            Self::WriteUnits { mode } => write!(f, "({})", mode.as_str()),
            Self::StageAgent { target, candidate } => write!(f, "({target} -> {candidate})"),
            Self::DiscardCandidate { candidate } => write!(f, "({candidate})"),
            Self::SwitchAgent { to, .. } => write!(f, "({to})"),
            Self::ScheduleAgentRestart { delay_ms } => write!(f, "({delay_ms}ms)"),
            Self::ProvisionMachine { side, goal } => {
                write!(f, "({} {})", side.name(), goal.kubernetes_version)
            }
            Self::StartMachine { side }
            | Self::AwaitNode { side }
            | Self::StopMachine { side }
            | Self::RestartMachine { side, .. }
            | Self::RemoveMachine { side } => write!(f, "({})", side.name()),
            Self::Drain { holder, until, .. } => write!(f, "({holder} until {until})"),
            Self::DisableSwap
            | Self::Uncordon
            | Self::StartAgent
            | Self::RestartAgent
            | Self::WipeNode
            | Self::UninstallAgent => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::state::NodeSettings;

    /// An intent an older agent stored (the version alone) is read by this one.
    #[test]
    fn a_provisioning_stored_by_an_older_agent_still_reads() {
        let old = r#"{"effect":"provisionMachine","side":"kube2","kubernetes_version":"v1.34.2"}"#;
        let read: Effect = serde_json::from_str(old).expect("an older intent");
        assert_eq!(
            read,
            Effect::ProvisionMachine {
                side: Side::Kube2,
                goal: Goal::new(0, "v1.34.2"),
            }
        );
        let now = Effect::ProvisionMachine {
            side: Side::Kube1,
            goal: Goal {
                node: NodeSettings {
                    labels: [("team".to_string(), "blue".to_string())].into(),
                    taints: vec!["a:NoSchedule".into()],
                },
                ..Goal::new(3, "v1.34.3")
            },
        };
        let text = serde_json::to_string(&now).expect("json");
        assert_eq!(serde_json::from_str::<Effect>(&text).expect("back"), now);
    }
}
