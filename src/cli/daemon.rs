//! `flexnode daemon`: the agent on this host (systemd over D-Bus, containerd over gRPC, files
//! under `/`), as `flexnode-agent.service` runs it; or, with `--simulated-host`, over the
//! simulated host for labs and demos.

use super::{Failure, wiring};
use crate::config::kubeconfig::client_from_kubeconfig;
use crate::effects::host::AGENT_IMAGE_VAR;
use crate::effects::kube::KubePublisher;
use crate::exec::{Clock, SystemClock};
use crate::lifecycle::agent::InstallMode;
use crate::lifecycle::fault::Fault;
use crate::reconcile::DaemonConfig;
use crate::reconcile::fault;
use crate::sim::SimNode;
use crate::store::fault::of_store;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// The configuration `flexnode join` installed.
    #[arg(long, value_name = "FILE", default_value = crate::config::CONFIG_PATH)]
    pub config: PathBuf,
    /// With `--simulated-host`: this node's name (= the Kubernetes Node and the Machine).
    #[arg(long, env = "FLEXNODE_NODE", requires = "simulated_host")]
    pub node: Option<String>,
    /// With `--simulated-host`: the agent's credential.
    #[arg(long, env = "KUBECONFIG", requires = "simulated_host")]
    pub kubeconfig: Option<PathBuf>,
    /// Run against an in-memory simulated host (labs and demos): units, machines and agent
    /// builds are simulated; the store and the API server are real.
    #[arg(long)]
    pub simulated_host: bool,
    /// How often deadlines, TTLs and waiting work are looked at, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub tick_ms: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (loopback only; overrides the
    /// configuration's `metricsAddress`).
    #[arg(long, value_name = "ADDR", value_parser = metrics_address)]
    pub metrics_address: Option<std::net::SocketAddr>,
}

fn metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    crate::config::metrics_address(text).map_err(|e| e.message)
}

pub fn run(state: &Path, args: DaemonArgs) -> ExitCode {
    if args.simulated_host {
        super::block_on("daemon", async { Ok(simulated(state, &args).await?) })
    } else {
        super::block_on("daemon", on_host(state, &args))
    }
}

/// A fault only an operator can end (src/lifecycle/fault.rs): reported on every channel that
/// works (the Machine only with a publisher), then exit 78, which the agent unit does not
/// restart (`RestartPreventExitStatus=78`).
async fn refuse(fault: Fault, publisher: Option<&KubePublisher>) -> Failure {
    fault::tell(&fault, publisher).await;
    Failure::config(format!("{fault}; {}", fault.remedy()))
}

/// The agent on this host, until SIGTERM (systemd's stop) or SIGINT.
async fn on_host(state: &Path, args: &DaemonArgs) -> Result<(), Failure> {
    let (config, client) = match wiring::installed_config(&args.config).await {
        Ok(loaded) => loaded,
        // Without a configuration there is no credential: the log and STATUS say it.
        Err(fault) => return Err(refuse(fault, None).await),
    };
    let (client, renewing) = wiring::renewed_client(&config, client);
    let publisher = KubePublisher::new(client.clone(), &config.node_name);
    let exe = std::env::current_exe()?;
    let running = wiring::running().ok_or_else(|| match wiring::host_root() {
        Some(_) => anyhow::anyhow!(
            "this container does not say which image it runs ({AGENT_IMAGE_VAR}=…@sha256:…); \
             the container install's agent unit sets it"
        ),
        None => anyhow::anyhow!(
            "{} is not an installed agent build; the agent runs as \
             /opt/flexnode/current/flexnode (install it with `flexnode join`)",
            exe.display()
        ),
    })?;
    // Best effort: a daemon that cannot write it still runs the node.
    if let Err(e) = crate::units::write_doc(&wiring::on_host(crate::units::DOC_DIR)) {
        tracing::warn!(error = %e, "the units' documentation could not be written");
    }
    let tick = Duration::from_millis(args.tick_ms.max(100));
    let fx = wiring::host_effects(&config).await?;
    match fx.host.refresh_kubelet_plugin() {
        Ok(0) => {}
        Ok(files) => tracing::info!(
            files,
            "the kubelet's credential plugin and the files it reads are the agent's now"
        ),
        // The kubelet runs the build it has until the next start.
        Err(e) => tracing::warn!(error = %e, "the kubelet's credential plugin was not replaced"),
    }
    let runner = match wiring::daemon_runner(
        state,
        &config.node_name,
        client.clone(),
        (
            fx.systemd,
            // A long pull or unpack is progress too (a repave's, also one resumed at start-up)
            fx.containerd
                .with_heartbeat(std::sync::Arc::new(crate::reconcile::notify::progress)),
            fx.host,
        ),
        fx.settings,
    )
    .await
    {
        Ok(runner) => runner,
        Err(e) => {
            return Err(match of_store(&e, state) {
                Some(fault) => refuse(fault, Some(&publisher)).await,
                None => e.into(),
            });
        }
    };
    // Installed after the store opened: while the daemon waits for a store it can write,
    // SIGTERM ends it at once, as if it had not started.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = int.recv() => tracing::info!("SIGINT: stopping"),
        }
    };
    tracing::info!(
        node = %config.node_name,
        build = %running,
        init_ms = (crate::log::since_start().as_secs_f64() * 10_000.0).round() / 10.0,
        "flexnode daemon starting"
    );
    let ran = crate::reconcile::run(
        DaemonConfig {
            node_name: config.node_name,
            tick,
            etc: Some(wiring::on_host("/etc")),
            metrics: args.metrics_address.or(config.metrics_address),
            live_status: true,
            ..Default::default()
        },
        client,
        runner,
        running,
        shutdown,
    )
    .await;
    if let Some(task) = renewing {
        task.abort();
    }
    match ran {
        Ok(()) => Ok(()),
        Err(e) => match e.fault(state) {
            // Found while running (a page that fails to read): as at start.
            Some(fault) if fault.kind.needs_operator() => {
                Err(refuse(fault, Some(&publisher)).await)
            }
            _ => Err(e.into()),
        },
    }
}

/// The daemon over a simulated host, with systemd's part played here: a scheduled restart of
/// the agent ends this daemon and starts the selected build's.
async fn simulated(state: &Path, args: &DaemonArgs) -> anyhow::Result<()> {
    let (Some(node), Some(kubeconfig)) = (&args.node, &args.kubeconfig) else {
        anyhow::bail!("--simulated-host needs --node and --kubeconfig");
    };
    let client = client_from_kubeconfig(kubeconfig).await?;
    let mut sim = SimNode::new(state, SystemClock.now());
    sim.host.set_time_source(|| SystemClock.now());
    if sim.runner()?.state()?.node().is_none() {
        sim.join(InstallMode::Host, node).await?;
        eprintln!("flexnode daemon: joined {node} on the simulated host");
    }
    sim.stop_process();
    let host = sim.host.clone();
    let config = DaemonConfig {
        node_name: node.clone(),
        tick: Duration::from_millis(args.tick_ms.max(100)),
        metrics: args.metrics_address,
        live_status: true,
        ..Default::default()
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
        let mut term = signal(SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                restarted = restart => restarted,
                _ = tokio::signal::ctrl_c() => false,
                _ = term.recv() => false,
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<bool>();
        let runner = wiring::daemon_runner(
            state,
            node,
            client.clone(),
            (host.clone(), host.clone(), host.clone()),
            Default::default(),
        )
        .await?;
        let daemon =
            crate::reconcile::run(config.clone(), client.clone(), runner, running, async {
                let restarted = stop.await;
                let _ = tx.send(restarted);
            });
        daemon.await?;
        if !rx.await.unwrap_or(false) {
            host.agent_exited();
            return Ok(());
        }
        eprintln!("flexnode daemon: restart timer fired; starting the selected agent build");
    }
}
