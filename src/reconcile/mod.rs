//! The daemon: a Kubernetes reconciler for this node. Watches (own operations, selector
//! operations, own Machine, own Node), a timer and start-up reach one owner task as messages;
//! that task alone drives the state machine through the executor.

pub mod address;
pub mod clock;
pub mod health;
pub mod owner;
pub mod watch;

use crate::api::{Machine, MachineOperation};
use k8s_openapi::api::core::v1::Node;

pub use owner::{DaemonConfig, run};
pub use watch::{OperationWatch, WatchCounters};

/// What reaches the owner task.
#[derive(Debug)]
pub enum Msg {
    Operation(Box<MachineOperation>),
    OperationGone(String),
    /// An operation watch finished a (re-)list: every operation it selects has been sent.
    OperationsListed {
        watch: &'static str,
    },
    Node(Option<Box<Node>>),
    Machine(Option<Box<Machine>>),
}

/// The deletion taint (key kept for compatibility with the AKS Flex Node agent).
pub const DELETION_TAINT: &str = "kubernetes.azure.com/flex-node-deleting";

/// A client from a kubeconfig file (the agent's per-node credential, or an operator's).
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, kube::Error> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}
