//! `flexnode approver`: runs src/approver/ in the cluster (manifests/approver/, a Deployment of
//! the agent's image) or beside the control plane with a kubeconfig.

use super::Failure;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, clap::Args)]
pub struct ApproverArgs {
    /// The approver's credential; without it, the pod's service account.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`flexnode_approver_decisions_total`).
    #[arg(long, value_name = "IP:PORT")]
    metrics_address: Option<SocketAddr>,
}

pub fn run(args: ApproverArgs) -> ExitCode {
    super::block_on("approver", async move {
        let client = match args.kubeconfig {
            Some(path) => super::op::client(Some(path)).await?,
            None => kube::Client::try_default().await.map_err(|e| {
                Failure::config(format!(
                    "no in-cluster credential ({e}): run in a pod of manifests/approver/ or pass \
                     --kubeconfig"
                ))
            })?,
        };
        let _metrics = crate::reconcile::metrics_server::start(args.metrics_address).await;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            () = crate::approver::run(client) => {}
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
        Ok(())
    })
}
