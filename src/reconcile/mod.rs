//! The daemon: a Kubernetes reconciler for this node. Watches (own operations, selector
//! operations, own Machine, own Node), a timer and start-up reach one owner task as messages;
//! that task alone drives the state machine through the executor.

pub mod address;
pub mod clock;
pub mod config;
pub mod fault;
pub mod metrics_server;
pub mod notify;
pub mod owner;
pub mod repave_pause;
pub mod status_socket;
pub mod watch;

use crate::api::{Machine, MachineOperation};
use k8s_openapi::api::core::v1::Node;

pub use config::DaemonConfig;
pub use owner::run;
pub use watch::{OperationWatch, WatchCounters};

/// What reaches the owner task.
#[derive(Debug)]
pub enum Msg {
    Operation(Box<MachineOperation>),
    OperationGone(String),
    /// An operation watch was interrupted: what it sent may be stale until it lists again.
    OperationsStale {
        watch: &'static str,
    },
    /// An operation watch finished a (re-)list: every operation it selects has been sent.
    OperationsListed {
        watch: &'static str,
    },
    Node(Option<Box<Node>>),
    Machine(Option<Box<Machine>>),
}

/// The deletion taint (key kept for compatibility with the AKS Flex Node agent).
pub use crate::lifecycle::kubelet::DELETION_TAINT;
