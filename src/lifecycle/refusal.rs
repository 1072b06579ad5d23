//! Why an input is not accepted in the current state. Refusals change nothing.

use super::state::OpRef;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the node has not joined")]
    NotJoined,
    #[error("the node has already joined")]
    AlreadyJoined,
    /// Another transition runs; the caller retries later (an operation stays Pending).
    #[error("busy: {phase}{}", op_suffix(.op))]
    Busy {
        phase: &'static str,
        op: Option<OpRef>,
    },
    #[error("operation {op} is already running")]
    AlreadyRunning { op: OpRef },
    #[error("operation {op} already finished on this node")]
    AlreadyFinished { op: OpRef },
    #[error("no effects are pending in state {state}")]
    NothingPending { state: &'static str },
    #[error("no agent upgrade is waiting for recovery")]
    NoUpgradePending,
    #[error("a reset is already under way")]
    ResetUnderWay,
}

fn op_suffix(op: &Option<OpRef>) -> String {
    op.as_ref().map(|o| format!(" ({o})")).unwrap_or_default()
}

impl Refusal {
    /// Refusals a caller retries later rather than reports.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Busy { .. } => true,
            Self::NotJoined
            | Self::AlreadyJoined
            | Self::AlreadyRunning { .. }
            | Self::AlreadyFinished { .. }
            | Self::NothingPending { .. }
            | Self::NoUpgradePending
            | Self::ResetUnderWay => false,
        }
    }
}

impl fmt::Display for super::state::ResetCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Operation => "AgentReset",
            Self::DeletionSignal => "deletion signal",
            Self::Cli => "flexnode reset",
        })
    }
}
