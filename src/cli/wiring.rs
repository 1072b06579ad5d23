//! The one composition root: the executor and its effects for the daemon (on this host or
//! over the simulated one) and for the commands that change the node (join, reset, recovery),
//! plus this host's facts they start from. Nothing else builds a `Runner`.

use crate::config::Config;
use crate::effects::archive::ArchiveFetcher;
use crate::effects::containerd::{DEFAULT_NAMESPACE, LazyContainerd, RegistryConfig};
use crate::effects::host::{FsHost, HostLayout, running_build};
use crate::effects::http::Trust;
use crate::effects::kube::KubePublisher;
use crate::effects::systemd::DbusSystemd;
use crate::effects::{Containerd, Effects, Host, Systemd};
use crate::exec::{Runner, SystemClock};
use crate::machine::NodeState;
use crate::machine::agent::AgentBuild;
use crate::reconcile::client_from_kubeconfig;
use crate::reconcile::owner::KubeRunner;
use crate::store::{Store, StoreError, StoreReader};
use std::path::Path;
use std::time::Duration;

pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";

/// How long a starting daemon waits for the store held by the command that started it.
const DAEMON_STORE_PATIENCE: Duration = Duration::from_secs(120);
/// How long reset and recovery wait for the stopping agent to release the store.
const COMMAND_STORE_PATIENCE: Duration = Duration::from_secs(60);

/// The effects a process on this host drives.
pub struct HostEffects {
    pub systemd: DbusSystemd,
    pub containerd: LazyContainerd,
    pub host: FsHost,
}

/// This host's effects, reaching https servers and registries as `config` says.
pub async fn host_effects(config: &Config) -> anyhow::Result<HostEffects> {
    let systemd = DbusSystemd::system()
        .await
        .map_err(|e| anyhow::anyhow!("systemd is not reachable on the system bus: {e}"))?;
    let trust = Trust {
        extra_ca_file: config.trusted_ca_file.clone(),
    };
    let registry = RegistryConfig {
        trust: trust.clone(),
        credentials: config.registry_credentials_file.clone(),
    };
    Ok(HostEffects {
        systemd,
        containerd: LazyContainerd::new(CONTAINERD_SOCKET, DEFAULT_NAMESPACE, registry),
        host: FsHost::new(HostLayout::at("/"))
            .with_fetcher(ArchiveFetcher::new().with_trust(trust)),
    })
}

/// The daemon's executor: `systemd`, `containerd` and `host` with the API server as
/// publisher, on the store (waiting while the command that started the daemon holds it).
pub async fn daemon_runner<S: Systemd, C: Containerd, H: Host>(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    systemd: S,
    containerd: C,
    host: H,
) -> anyhow::Result<KubeRunner<S, C, H>> {
    let store = Store::open_waiting(state, DAEMON_STORE_PATIENCE).await?;
    let effects = Effects {
        systemd,
        containerd,
        host,
        publisher: KubePublisher::new(client, node_name),
    };
    Ok(Runner::new(store, effects, SystemClock))
}

/// The executor as a command (not the daemon) runs it.
pub type CommandRunner = Runner<DbusSystemd, LazyContainerd, FsHost, KubePublisher, SystemClock>;

/// The executor for a command acting for the agent (join, reset, recovery) on `store`: it is
/// not the daemon, and it first finishes whatever a crash interrupted.
async fn command_runner(
    store: Store,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
) -> anyhow::Result<CommandRunner> {
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

/// Join's executor: the store must be free (a second join or a reset would hold it).
pub async fn join_runner(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
) -> anyhow::Result<CommandRunner> {
    let store = Store::open(state).map_err(|e| match e {
        StoreError::Locked(_) => anyhow::anyhow!(
            "another flexnode process holds {}; is a join or reset running?",
            state.display()
        ),
        e => e.into(),
    })?;
    command_runner(store, node_name, client, fx).await
}

/// Reset's and recovery's executor: waits while the stopping agent still holds the store.
pub async fn agent_command_runner(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
) -> anyhow::Result<CommandRunner> {
    let store = Store::open_waiting(state, COMMAND_STORE_PATIENCE).await?;
    command_runner(store, node_name, client, fx).await
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

/// Where the node stands, from the store (readable while the agent runs); `None` without one.
pub fn current_state(state: &Path) -> anyhow::Result<Option<NodeState>> {
    match StoreReader::open(state) {
        Ok(reader) => Ok(Some(reader.load()?.state)),
        Err(StoreError::Missing(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
