//! The operation kinds the agent runs, and the one mapping of each to its name.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Operation kinds the agent runs; other kinds are left to other controllers by the reconciler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimKind {
    NodeReboot,
    AgentReset,
    /// Parameters are raw API data (they may hold secrets) and are validated by the core.
    AgentUpgrade {
        parameters: BTreeMap<String, String>,
    },
}

impl ClaimKind {
    /// The operation kind's name, as the MachineOperation's `operationKind` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::NodeReboot => "NodeReboot",
            Self::AgentReset => "AgentReset",
            Self::AgentUpgrade { .. } => "AgentUpgrade",
        }
    }
}
