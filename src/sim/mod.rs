//! The simulated host and node. A model of the host, not a call recorder: the real core, store
//! and executor run end to end against it, with scripted failures and crashes. For the core's
//! and the crash simulation's tests, the README's first demo and `flexnode daemon
//! --simulated-host`; never instead of the tests against real daemons.

mod effects;
mod host;
mod node;
mod publisher;
mod world;

pub use host::{HostSnapshot, SimHost, StopAtCrash, UnitSnapshot};
pub use node::{
    GOAL_VERSION, INSTALLED_IMAGE, RECOVERY_MESSAGE, SimClock, SimError, SimNode, SimRunner,
    upgrade,
};
pub use world::{
    ApiWrite, Build, Event, Fault, FaultKind, PlannedCrash, RestartTimer, SimMachine, SimUnit,
    When, World,
};
