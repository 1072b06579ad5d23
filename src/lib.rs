//! flexnode: a node agent that joins a Linux host to Kubernetes and runs its lifecycle.
//!
//! `machine` is the pure core; `store` its durable memory; `effects` the traits over the host
//! and API server (with a simulated host); `exec` drives the core through them.
pub mod api;
pub mod cli;
pub mod config;
pub mod daemon_cli;
pub mod effects;
pub mod exec;
pub mod join_cli;
pub mod machine;
pub mod node_host;
pub mod opcli;
pub mod reconcile;
pub mod recover_cli;
pub mod report;
pub mod reset_cli;
pub mod simlab;
pub mod store;
pub mod units;
