//! Node states. Each variant carries the data it needs (operation, target, attempt, deadline),
//! so a stored state is enough to resume after a crash.

use super::agent::{AgentBuild, InstallMode};
use super::agent::{Arch, UpgradeTarget};
use super::kind::ClaimKind;
use super::result::MachinePhase;
use super::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The blue/green nspawn machines that run the kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Kube1,
    Kube2,
}

impl Side {
    pub fn other(self) -> Self {
        match self {
            Self::Kube1 => Self::Kube2,
            Self::Kube2 => Self::Kube1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Kube1 => "kube1",
            Self::Kube2 => "kube2",
        }
    }
}

/// A MachineOperation's identity: a deleted and recreated object with the same name is new.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpRef {
    pub name: String,
    pub uid: String,
}

impl fmt::Display for OpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)
    }
}

/// A claimed operation being run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpRun {
    pub op: OpRef,
    pub started_at: Timestamp,
    pub deadline: Timestamp,
    pub attempt: u32,
    /// `metadata.generation` of the node's Machine when the operation started (0 = absent).
    pub machine_generation: i64,
}

/// The node's goal as applied: the Machine generation is the settings version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Goal {
    /// Older stored effects (`ProvisionMachine`) lack it: 0, no Machine.
    #[serde(default)]
    pub generation: i64,
    pub kubernetes_version: String,
    /// Older stores lack it: no labels, no taints.
    #[serde(default, skip_serializing_if = "NodeSettings::is_empty")]
    pub node: NodeSettings,
}

impl Goal {
    /// A goal of `kubernetes_version` at `generation` with no node settings.
    pub fn new(generation: i64, kubernetes_version: &str) -> Self {
        Self {
            generation,
            kubernetes_version: kubernetes_version.to_string(),
            node: NodeSettings::default(),
        }
    }
}

/// What the Machine asks of its Node (`spec.kubernetes.nodeLabels`, `registerWithTaints`):
/// the kubelet registers the Node with them, so they take effect when a side is provisioned
/// (join, repave) and are checked there (`kubelet::check_node_settings`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSettings {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `key[=value]:Effect`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

impl NodeSettings {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.taints.is_empty()
    }
}

/// Operation UIDs that already finished here, newest last; a second claim of one is refused
/// even if the API server shows it again (e.g. a status write was lost).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FinishedOps(Vec<String>);

impl FinishedOps {
    const KEEP: usize = 64;

    pub fn contains(&self, uid: &str) -> bool {
        self.0.iter().any(|u| u == uid)
    }

    pub fn with(&self, uid: &str) -> Self {
        let mut v = self.0.clone();
        if !v.iter().any(|u| u == uid) {
            v.push(uid.to_string());
        }
        let excess = v.len().saturating_sub(Self::KEEP);
        v.drain(..excess);
        Self(v)
    }
}

/// Everything known about a joined node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub mode: InstallMode,
    pub arch: Arch,
    pub active: Side,
    pub applied: Goal,
    pub previous: Option<Goal>,
    pub agent: AgentBuild,
    pub last_good: Option<AgentBuild>,
    pub finished: FinishedOps,
}

impl NodeInfo {
    pub(crate) fn finishing(&self, uid: &str) -> Self {
        Self {
            finished: self.finished.with(uid),
            ..self.clone()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JoinPhase {
    /// Agent files, units and the first nspawn machine.
    Installing,
    /// The agent service.
    Starting,
}

/// A NodeReboot's steps: the drain, then the machine's restart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RebootPhase {
    /// Cordon the Node and evict its pods; nothing restarted yet.
    Draining,
    /// Restart the machine and wait for its kubelet (older stores: the only phase).
    #[default]
    Restarting,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpgradePhase {
    /// Download or pull, verify, install into the candidate, run its `version`.
    Staging,
    /// Point `current` (host) or the image selection (container) at the candidate.
    Switching,
    /// Restart scheduled; the successor daemon judges the upgrade.
    HandingOff,
    /// Undo the switch. `restart` means the agent unit is being restarted onto the old build
    /// (recovery path), so the result waits for that daemon.
    RollingBack {
        reason: super::result::ResultReason,
        message: String,
        restart: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RepavePhase {
    /// Build the new side while the old one still runs.
    Provisioning,
    /// The new side is built: evict the old side's pods before it stops.
    Draining,
    /// Stop the old side, start the new one, wait for its kubelet.
    SwitchingOver,
    /// The new side failed after the old one stopped: bring the old one back.
    RollingBack { message: String },
    /// The new side runs; remove the old one.
    Retiring,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResetCause {
    /// An AgentReset MachineOperation.
    Operation,
    /// The deletion taint on the Node plus the Machine gone.
    DeletionSignal,
    /// `flexnode reset`.
    Cli,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResetPhase {
    /// Cordon the Node and evict its pods; nothing wiped yet.
    Draining,
    Wiping,
    /// The operation's result must reach the API server before the daemon goes away.
    Publishing,
    Uninstalling,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum NodeState {
    Unjoined {
        #[serde(default)]
        finished: FinishedOps,
    },
    Joining {
        node: NodeInfo,
        phase: JoinPhase,
        deadline: Timestamp,
    },
    Ready {
        node: NodeInfo,
    },
    Rebooting {
        node: NodeInfo,
        run: OpRun,
        #[serde(default)]
        phase: RebootPhase,
    },
    Upgrading {
        node: NodeInfo,
        run: OpRun,
        target: UpgradeTarget,
        candidate: AgentBuild,
        phase: UpgradePhase,
    },
    Repaving {
        node: NodeInfo,
        goal: Goal,
        phase: RepavePhase,
        deadline: Timestamp,
    },
    Resetting {
        node: NodeInfo,
        run: Option<OpRun>,
        cause: ResetCause,
        phase: ResetPhase,
        deadline: Timestamp,
    },
}

impl Default for NodeState {
    fn default() -> Self {
        Self::Unjoined {
            finished: FinishedOps::default(),
        }
    }
}

impl NodeState {
    /// The Machine phase this state reports, back from a fault that marked the Machine
    /// `Failed`; `None` before a join.
    pub fn machine_phase(&self) -> Option<MachinePhase> {
        match self {
            Self::Unjoined { .. } => None,
            Self::Joining { .. } => Some(MachinePhase::Joining),
            Self::Rebooting { .. } => Some(MachinePhase::Rebooting),
            Self::Repaving { .. } => Some(MachinePhase::Provisioning),
            Self::Ready { .. } | Self::Upgrading { .. } | Self::Resetting { .. } => {
                Some(MachinePhase::Ready)
            }
        }
    }

    /// The phase name users see in `flexnode status`.
    pub fn phase_name(&self) -> &'static str {
        match self {
            Self::Unjoined { .. } => "Unjoined",
            Self::Joining { .. } => "Joining",
            Self::Ready { .. } => "Ready",
            Self::Rebooting { .. } => "Rebooting",
            Self::Upgrading { .. } => "Upgrading",
            Self::Repaving { .. } => "Repaving",
            Self::Resetting { .. } => "Resetting",
        }
    }

    /// The sub-phase, for states that have one.
    pub fn step_name(&self) -> Option<&'static str> {
        match self {
            Self::Unjoined { .. } | Self::Ready { .. } => None,
            Self::Rebooting { phase, .. } => Some(match phase {
                RebootPhase::Draining => "Draining",
                RebootPhase::Restarting => "Restarting",
            }),
            Self::Joining { phase, .. } => Some(match phase {
                JoinPhase::Installing => "Installing",
                JoinPhase::Starting => "Starting",
            }),
            Self::Upgrading { phase, .. } => Some(match phase {
                UpgradePhase::Staging => "Staging",
                UpgradePhase::Switching => "Switching",
                UpgradePhase::HandingOff => "HandingOff",
                UpgradePhase::RollingBack { .. } => "RollingBack",
            }),
            Self::Repaving { phase, .. } => Some(match phase {
                RepavePhase::Provisioning => "Provisioning",
                RepavePhase::Draining => "Draining",
                RepavePhase::SwitchingOver => "SwitchingOver",
                RepavePhase::RollingBack { .. } => "RollingBack",
                RepavePhase::Retiring => "Retiring",
            }),
            Self::Resetting { phase, .. } => Some(match phase {
                ResetPhase::Draining => "Draining",
                ResetPhase::Wiping => "Wiping",
                ResetPhase::Publishing => "Publishing",
                ResetPhase::Uninstalling => "Uninstalling",
            }),
        }
    }

    pub fn node(&self) -> Option<&NodeInfo> {
        match self {
            Self::Unjoined { .. } => None,
            Self::Joining { node, .. }
            | Self::Ready { node }
            | Self::Rebooting { node, .. }
            | Self::Upgrading { node, .. }
            | Self::Repaving { node, .. }
            | Self::Resetting { node, .. } => Some(node),
        }
    }

    pub fn run(&self) -> Option<&OpRun> {
        match self {
            Self::Unjoined { .. }
            | Self::Joining { .. }
            | Self::Ready { .. }
            | Self::Repaving { .. } => None,
            Self::Rebooting { run, .. } | Self::Upgrading { run, .. } => Some(run),
            Self::Resetting { run, .. } => run.as_ref(),
        }
    }

    /// The operation this state runs and its kind, as [`ClaimKind::name`] spells it.
    pub fn operation(&self) -> Option<(&OpRef, &'static str)> {
        match self {
            Self::Rebooting { run, .. } => Some((&run.op, ClaimKind::node_reboot().name())),
            Self::Upgrading { run, .. } => Some((
                &run.op,
                ClaimKind::AgentUpgrade {
                    parameters: Default::default(),
                }
                .name(),
            )),
            Self::Resetting { run: Some(run), .. } => {
                Some((&run.op, ClaimKind::agent_reset().name()))
            }
            Self::Unjoined { .. }
            | Self::Joining { .. }
            | Self::Ready { .. }
            | Self::Repaving { .. }
            | Self::Resetting { run: None, .. } => None,
        }
    }

    /// Every state that is not at rest has a wall-clock deadline.
    pub fn deadline(&self) -> Option<Timestamp> {
        match self {
            Self::Unjoined { .. } | Self::Ready { .. } => None,
            Self::Rebooting { run, .. } | Self::Upgrading { run, .. } => Some(run.deadline),
            Self::Joining { deadline, .. }
            | Self::Repaving { deadline, .. }
            | Self::Resetting { deadline, .. } => Some(*deadline),
        }
    }

    /// True while the next agent process, not this one, decides the operation's result.
    pub fn awaits_successor(&self) -> bool {
        match self {
            Self::Upgrading { phase, .. } => match phase {
                UpgradePhase::HandingOff => true,
                UpgradePhase::RollingBack { restart, .. } => *restart,
                UpgradePhase::Staging | UpgradePhase::Switching => false,
            },
            Self::Unjoined { .. }
            | Self::Joining { .. }
            | Self::Ready { .. }
            | Self::Rebooting { .. }
            | Self::Repaving { .. }
            | Self::Resetting { .. } => false,
        }
    }

    /// True when the executor must report the outcome of this step's effects
    /// (`EffectsDone`/`EffectsFailed`). A hand-off instead waits for the successor daemon.
    pub fn awaits_effects(&self) -> bool {
        match self {
            Self::Unjoined { .. } | Self::Ready { .. } => false,
            Self::Upgrading { phase, .. } => match phase {
                UpgradePhase::Staging | UpgradePhase::Switching => true,
                UpgradePhase::HandingOff => false,
                UpgradePhase::RollingBack { restart, .. } => !restart,
            },
            Self::Joining { .. }
            | Self::Rebooting { .. }
            | Self::Repaving { .. }
            | Self::Resetting { .. } => true,
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.phase_name())?;
        if let Some(step) = self.step_name() {
            write!(f, "/{step}")?;
        }
        if let Some(run) = self.run() {
            write!(f, " op={}", run.op)?;
        }
        if let Some(node) = self.node() {
            write!(f, " side={} agent={}", node.active.name(), node.agent)?;
        }
        Ok(())
    }
}
