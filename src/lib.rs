//! flexnode: a node agent that joins a Linux host to Kubernetes and runs its lifecycle.
//!
//! `lifecycle` is the pure core (the node's states and transitions); `store` its durable
//! memory; `effects` the traits over the host and API server (with a simulated host); `exec`
//! drives the core through them.
/// The version this build reports (`flexnode version`, User-Agent). `FLEXNODE_VERSION` at
/// build time overrides the crate version: the e2e lab builds a second, distinguishable
/// build to upgrade to.
pub const VERSION: &str = match option_env!("FLEXNODE_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

pub mod api;
pub mod approver;
pub mod cli;
pub mod config;
pub mod effects;
pub mod exec;
pub mod identity;
pub mod ignition;
pub mod lifecycle;
pub mod log;
pub mod metrics;
pub mod reconcile;
pub mod sim;
pub mod status_report;
pub mod store;
pub mod text;
pub mod units;
