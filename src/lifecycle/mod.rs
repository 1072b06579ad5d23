//! The pure node-lifecycle core.
//!
//! Everything in here is deterministic: no async runtime, API client, D-Bus, database,
//! filesystem or clock.
//! Time arrives as a parameter, effects leave as data, and illegal inputs come back as typed
//! refusals. The executor (`crate::exec`) is the only place that turns effects into actions.
#![deny(clippy::wildcard_enum_match_arm)]

pub mod agent;
pub mod decide;
pub mod drain;
pub mod effect;
pub mod fault;
pub mod input;
pub mod kind;
pub mod kubelet;
pub mod policy;
pub mod refusal;
pub mod result;
pub mod state;
pub mod step;
pub mod table;
pub mod time;
pub mod validate;

pub use effect::Effect;
pub use input::Input;
pub use refusal::Refusal;
pub use state::NodeState;
pub use step::{Step, preempts, step};
pub use time::Timestamp;
