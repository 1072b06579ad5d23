//! Inputs reach the single state-machine owner as messages: from watches, timers, the CLI,
//! effect completions and daemon start-up.

pub use super::kind::ClaimKind;
use super::state::{Goal, OpRef};

use super::agent::Arch;
use super::agent::{AgentBuild, InstallMode};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What the recovery unit reports by default (`flexnode recover-agent-upgrade`).
pub const RECOVERY_MESSAGE: &str = "upgraded daemon failed repeatedly; restored last-good agent";

/// What `flexnode join` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    pub node_name: String,
    pub mode: InstallMode,
    pub arch: Arch,
    pub goal: Goal,
    /// The build doing the join (becomes the first agent).
    pub agent: AgentBuild,
}

/// A MachineOperation addressed to this node, phase empty or Pending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub op: OpRef,
    pub kind: ClaimKind,
    pub machine_generation: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeObservation {
    Absent,
    Present { deletion_taint: bool },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MachineObservation {
    /// The read succeeded and found nothing (404).
    Missing,
    Present(Goal),
    /// The read returned no object and no error (the anchor's "nil" row).
    Unknown,
}

/// The goal side of the world: the node's Node and Machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoalObservation {
    pub node: NodeObservation,
    pub machine: MachineObservation,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "camelCase")]
pub enum Input {
    Join(JoinRequest),
    OperationClaimed(Claim),
    GoalObserved(GoalObservation),
    /// Every effect of the last step is done.
    EffectsDone,
    /// An effect of the last step failed; the message is already redacted.
    EffectsFailed {
        message: String,
    },
    /// A daemon process started (after pending effects were resumed) running `running`;
    /// `selected`: the build the host selects to run (the `current` link, the image
    /// selection), if known.
    DaemonStarted {
        running: AgentBuild,
        selected: Option<AgentBuild>,
    },
    /// The recovery unit found the agent crash-looping (run by the last-good build).
    RecoveryRequested {
        message: String,
    },
    /// `flexnode reset`.
    ResetRequested,
    /// Time passed; deadlines are checked against the `now` given to `step`.
    Tick,
}

impl Input {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Join(_) => "Join",
            Self::OperationClaimed(_) => "OperationClaimed",
            Self::GoalObserved(_) => "GoalObserved",
            Self::EffectsDone => "EffectsDone",
            Self::EffectsFailed { .. } => "EffectsFailed",
            Self::DaemonStarted { .. } => "DaemonStarted",
            Self::RecoveryRequested { .. } => "RecoveryRequested",
            Self::ResetRequested => "ResetRequested",
            Self::Tick => "Tick",
        }
    }
}

/// One line for the journal: never the operation parameters.
impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            Self::Join(j) => write!(f, "({} {})", j.node_name, j.mode.as_str()),
            Self::OperationClaimed(c) => {
                write!(f, "({} {})", c.kind.name(), c.op)
            }
            Self::GoalObserved(g) => {
                let node = match g.node {
                    NodeObservation::Absent => "node absent",
                    NodeObservation::Present {
                        deletion_taint: true,
                    } => "node tainted for deletion",
                    NodeObservation::Present {
                        deletion_taint: false,
                    } => "node present",
                };
                match &g.machine {
                    MachineObservation::Missing => write!(f, "({node}, machine missing)"),
                    MachineObservation::Unknown => write!(f, "({node}, machine unknown)"),
                    MachineObservation::Present(goal) => {
                        write!(f, "({node}, machine generation {})", goal.generation)
                    }
                }
            }
            Self::EffectsFailed { message } | Self::RecoveryRequested { message } => {
                write!(f, "({message})")
            }
            Self::DaemonStarted { running, selected } => match selected {
                Some(selected) if selected != running => {
                    write!(f, "({running}; {selected} selected)")
                }
                Some(_) | None => write!(f, "({running})"),
            },
            Self::EffectsDone | Self::ResetRequested | Self::Tick => Ok(()),
        }
    }
}
