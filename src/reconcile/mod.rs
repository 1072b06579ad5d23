//! The daemon: a Kubernetes reconciler for this node. Watches (own operations, selector
//! operations, own Machine, own Node), a timer and start-up reach one owner task as messages;
//! that task alone drives the state machine through the executor.

pub mod address;
pub mod clock;
pub mod config;
pub mod health;
pub mod live;
pub mod liveness;
pub mod metrics;
pub mod owner;
pub mod repave_pause;
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
pub const DELETION_TAINT: &str = "kubernetes.azure.com/flex-node-deleting";

/// A client from a kubeconfig file (the agent's per-node credential, or an operator's). One
/// whose API server would not be verified (`insecure-skip-tls-verify`, plain http) is refused:
/// TLS verification is never turned off silently.
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, kube::Error> {
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(kube::Error::InferKubeconfig)?;
    if let Some(why) = unverified(&config) {
        return Err(kube::Error::InferKubeconfig(
            kube::config::KubeconfigError::LoadClusterOfContext(why.into()),
        ));
    }
    kube::Client::try_from(config)
}

/// Why the client `config` describes would not verify the API server, if it would not.
fn unverified(config: &kube::Config) -> Option<&'static str> {
    if config.accept_invalid_certs {
        Some(
            "the kubeconfig sets insecure-skip-tls-verify; flexnode verifies the API server \
             (name its CA in certificate-authority-data)",
        )
    } else if config.cluster_url.scheme_str() != Some("https") {
        Some("the kubeconfig's API server is not https://; flexnode only speaks TLS to it")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's kubeconfig (`flexnode op`) too: a client that would not verify the API
    /// server is never built.
    #[tokio::test]
    async fn clients_that_would_not_verify_the_api_server_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let kubeconfig = |name: &str, cluster: &str| {
            let path = dir.path().join(name);
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\
                     users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  \
                     context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
                ),
            )
            .expect("write");
            path
        };
        let ok = kubeconfig("ok", "    server: https://127.0.0.1:6443\n");
        assert!(client_from_kubeconfig(&ok).await.is_ok());
        for (name, cluster, why) in [
            (
                "insecure",
                "    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n",
                "insecure-skip-tls-verify",
            ),
            ("http", "    server: http://127.0.0.1:8080\n", "https://"),
        ] {
            let Err(e) = client_from_kubeconfig(&kubeconfig(name, cluster)).await else {
                panic!("{name}: a client was built");
            };
            assert!(e.to_string().contains(why), "{name}: {e}");
        }
    }
}
