//! What an operation ends with (the reasons of the MachineOperation `Completed` condition) and
//! the Machine phases flexnode reports. Each value has one string form; `parse` reads it back
//! and knows nothing else, so a value flexnode did not write is never guessed at.

use super::time::Timestamp;
use serde::{Deserialize, Serialize};

/// Reasons of the MachineOperation `Completed` condition flexnode writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResultReason {
    Succeeded,
    InvalidParameters,
    ExecutionFailed,
    DaemonFailed,
}

impl ResultReason {
    pub const ALL: [Self; 4] = [
        Self::Succeeded,
        Self::InvalidParameters,
        Self::ExecutionFailed,
        Self::DaemonFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "Succeeded",
            Self::InvalidParameters => "InvalidParameters",
            Self::ExecutionFailed => "ExecutionFailed",
            Self::DaemonFailed => "DaemonFailed",
        }
    }

    /// The reason `as_str` wrote, or `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    pub fn succeeded(self) -> bool {
        match self {
            Self::Succeeded => true,
            Self::InvalidParameters | Self::ExecutionFailed | Self::DaemonFailed => false,
        }
    }

    /// The operation's terminal phase: `Complete` for success, `Failed` otherwise.
    pub fn phase(self) -> &'static str {
        if self.succeeded() {
            "Complete"
        } else {
            "Failed"
        }
    }
}

/// A terminal operation result. Messages are fixed strings or already-redacted error text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    pub reason: ResultReason,
    pub message: String,
    pub started_at: Timestamp,
    pub machine_generation: i64,
}

/// Machine `status.phase` values flexnode writes (`docs/design.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MachinePhase {
    Joining,
    Ready,
    Rebooting,
    Provisioning,
    Failed,
}

impl MachinePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Joining => "Joining",
            Self::Ready => "Ready",
            Self::Rebooting => "Rebooting",
            Self::Provisioning => "Provisioning",
            Self::Failed => "Failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_back_exactly() {
        for r in ResultReason::ALL {
            assert_eq!(ResultReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(ResultReason::parse("UnsupportedOperation"), None);
        assert_eq!(ResultReason::parse("succeeded"), None);
    }
}
