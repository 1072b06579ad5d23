//! `flexnode daemon`. Real host effects (systemd over D-Bus, containerd over gRPC) come with
//! their own issue; until then the daemon runs against the simulated host on request, which
//! is what labs and demos use (`--simulated-host`).

use crate::exec::{Clock, SystemClock};
use crate::machine::state::InstallMode;
use crate::reconcile::{DaemonConfig, client_from_kubeconfig};
use crate::simlab::SimNode;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// This node's name (= the Kubernetes Node and the Machine).
    #[arg(long, env = "FLEXNODE_NODE")]
    pub node: String,
    /// The agent's credential (a client certificate for `system:flexnode:<node>`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: PathBuf,
    /// Run against an in-memory simulated host (labs and demos): units, machines and agent
    /// builds are simulated; the store and the API server are real.
    #[arg(long)]
    pub simulated_host: bool,
    /// How often deadlines, TTLs and waiting work are looked at, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub tick_ms: u64,
}

pub fn run(state: &Path, args: DaemonArgs) -> ExitCode {
    if !args.simulated_host {
        eprintln!(
            "flexnode daemon: real host effects (systemd, containerd) are not implemented yet; \
             run with --simulated-host for a lab"
        );
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flexnode daemon: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(simulated(state, &args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flexnode daemon: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The daemon over a simulated host, with systemd's part played here: a scheduled restart of
/// the agent ends this daemon and starts the selected build's.
async fn simulated(state: &Path, args: &DaemonArgs) -> anyhow::Result<()> {
    let client = client_from_kubeconfig(&args.kubeconfig).await?;
    let mut sim = SimNode::new(state, SystemClock.now());
    sim.host.set_time_source(|| SystemClock.now());
    if sim.runner()?.state()?.node().is_none() {
        sim.join(InstallMode::Host, &args.node).await?;
        eprintln!(
            "flexnode daemon: joined {} on the simulated host",
            args.node
        );
    }
    sim.stop_process();
    let host = sim.host.clone();
    let config = DaemonConfig {
        node_name: args.node.clone(),
        state_path: state.to_path_buf(),
        tick: Duration::from_millis(args.tick_ms.max(100)),
    };
    loop {
        let (running, _) = host
            .selected_build()
            .ok_or_else(|| anyhow::anyhow!("no agent build is selected"))?;
        host.agent_started();
        let restart = {
            let host = host.clone();
            async move {
                loop {
                    if !host.world().restart_timers.is_empty() {
                        host.world().restart_timers.clear();
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                restarted = restart => restarted,
                _ = tokio::signal::ctrl_c() => false,
                _ = term.recv() => false,
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<bool>();
        let daemon = crate::reconcile::run(
            config.clone(),
            client.clone(),
            host.clone(),
            host.clone(),
            host.clone(),
            running,
            async {
                let restarted = stop.await;
                let _ = tx.send(restarted);
            },
        );
        daemon.await?;
        if !rx.await.unwrap_or(false) {
            return Ok(());
        }
        eprintln!("flexnode daemon: restart timer fired; starting the selected agent build");
    }
}
