//! This host's real effects and facts, shared by the daemon and the commands that change the
//! node (join, reset, recovery): systemd over D-Bus, containerd over gRPC, files under `/`.

use crate::config::Config;
use crate::effects::Effects;
use crate::effects::containerd::DEFAULT_NAMESPACE;
use crate::effects::host::{FsHost, HostLayout, running_build};
use crate::effects::lazy_containerd::LazyContainerd;
use crate::effects::systemd::DbusSystemd;
use crate::exec::{Runner, SystemClock};
use crate::machine::NodeState;
use crate::machine::state::AgentBuild;
use crate::reconcile::client_from_kubeconfig;
use crate::reconcile::publisher::KubePublisher;
use crate::store::{Store, StoreError, StoreReader};
use std::path::Path;
use std::time::Duration;

pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// The effects a process on this host drives.
pub struct HostEffects {
    pub systemd: DbusSystemd,
    pub containerd: LazyContainerd,
    pub host: FsHost,
}

pub async fn effects() -> anyhow::Result<HostEffects> {
    let systemd = DbusSystemd::system()
        .await
        .map_err(|e| anyhow::anyhow!("systemd is not reachable on the system bus: {e}"))?;
    Ok(HostEffects {
        systemd,
        containerd: LazyContainerd::new(CONTAINERD_SOCKET, DEFAULT_NAMESPACE),
        host: FsHost::new(HostLayout::at("/")),
    })
}

/// Which installed build this process is, or `None` when it runs from elsewhere (a copy the
/// operator runs `join` from).
pub fn running() -> Option<AgentBuild> {
    let exe = std::env::current_exe().ok()?;
    running_build(&HostLayout::at("/"), &exe)
}

/// The kernel's host name: the default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default()
}

/// Changing the node needs root (units, `/opt/flexnode`, the store).
pub fn require_root(command: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        crate::config::process_uid() == Some(0),
        "flexnode {command} must run as root"
    );
    Ok(())
}

/// The installed configuration (as `join` rendered it) and an API client from it.
pub async fn installed_config(path: &Path) -> anyhow::Result<(Config, kube::Client)> {
    let config =
        Config::load(path, &hostname()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let client = client_from_kubeconfig(&config.kubeconfig)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.kubeconfig.display()))?;
    Ok((config, client))
}

/// The executor as a command (not the daemon) runs it, on the store the agent releases.
pub type CommandRunner = Runner<DbusSystemd, LazyContainerd, FsHost, KubePublisher, SystemClock>;

/// Opens the store for a command that acts for the agent (reset, recovery): waits while the
/// stopping agent still holds it, then finishes whatever a crash interrupted.
pub async fn command_runner(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
) -> anyhow::Result<CommandRunner> {
    let store = Store::open_waiting(state, Duration::from_secs(60)).await?;
    let mut runner = Runner::new(
        store,
        Effects {
            systemd: fx.systemd,
            containerd: fx.containerd,
            host: fx.host,
            publisher: KubePublisher::new(client, node_name),
        },
        SystemClock,
    );
    runner.daemon = false;
    runner.resume().await?;
    Ok(runner)
}

/// Where the node stands, from the store (readable while the agent runs); `None` without one.
pub fn current_state(state: &Path) -> anyhow::Result<Option<NodeState>> {
    match StoreReader::open(state) {
        Ok(reader) => Ok(Some(reader.load()?.state)),
        Err(StoreError::Missing(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
