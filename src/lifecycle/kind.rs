//! The operation kinds the agent runs, and the one mapping of each to its name.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Operation kinds the agent runs; other kinds are left to other controllers by the reconciler.
///
/// Parameters are raw API data (they may hold secrets) and are validated by the core: the
/// drain's for NodeReboot and AgentReset (`drain.rs`), the download's for AgentUpgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimKind {
    NodeReboot {
        parameters: BTreeMap<String, String>,
    },
    AgentReset {
        parameters: BTreeMap<String, String>,
    },
    AgentUpgrade {
        parameters: BTreeMap<String, String>,
    },
}

impl ClaimKind {
    /// A NodeReboot with no parameters (drained as the configuration says).
    pub fn node_reboot() -> Self {
        Self::NodeReboot {
            parameters: BTreeMap::new(),
        }
    }

    /// An AgentReset with no parameters (drained as the configuration says).
    pub fn agent_reset() -> Self {
        Self::AgentReset {
            parameters: BTreeMap::new(),
        }
    }

    /// The operation kind's name, as the MachineOperation's `operationKind` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::NodeReboot { .. } => "NodeReboot",
            Self::AgentReset { .. } => "AgentReset",
            Self::AgentUpgrade { .. } => "AgentUpgrade",
        }
    }
}
