//! The one composition root: the executor and its effects for the daemon (on this host or
//! over the simulated one) and for the commands that change the node (join, reset, recovery),
//! plus this host's facts they start from. Nothing else builds a `Runner`.

use crate::config::kubeconfig::client_from_kubeconfig;
use crate::config::{Config, NodeImages};
use crate::effects::archive::ArchiveFetcher;
use crate::effects::containerd::{DEFAULT_NAMESPACE, LazyContainerd, RegistryConfig};
use crate::effects::host::{
    AGENT_IMAGE_VAR, FsHost, HostLayout, KubeletInputs, KubeletSource, image_ref_digest,
    kubelet_plugin, resolve_in_root, running_build,
};
use crate::effects::http::Trust;
use crate::effects::kube::KubePublisher;
use crate::effects::systemd::{DEFAULT_UNIT_DIR, DbusSystemd};
use crate::effects::{Containerd, Effects, Host, Publisher, Systemd};
use crate::exec::{Clock, Runner};
use crate::lifecycle::NodeState;
use crate::lifecycle::Timestamp;
use crate::lifecycle::agent::AgentBuild;
use crate::lifecycle::drain::DrainPolicy;
use crate::lifecycle::fault::{Fault, FaultKind};
use crate::lifecycle::policy::Policy;
use crate::reconcile::clock::SteadyClock;
use crate::reconcile::owner::KubeRunner;
use crate::reconcile::{fault, notify};
use crate::store::fault::of_store;
use crate::store::{Store, StoreError, StoreReader};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
/// Where a process in a container of the agent's image sees the host's root (the container
/// units bind it there); unset on the host install.
pub const HOST_ROOT_VAR: &str = "FLEXNODE_HOST_ROOT";

/// How long a starting daemon waits for the store held by the command that started it.
const DAEMON_STORE_PATIENCE: Duration = Duration::from_secs(120);
/// How often a starting daemon tries again to open a store it could not write.
const STORE_RETRY: Duration = Duration::from_secs(2);
/// How long reset and recovery wait for the stopping agent to release the store.
const COMMAND_STORE_PATIENCE: Duration = Duration::from_secs(60);

/// The effects a process on this host drives.
pub struct HostEffects {
    pub systemd: DbusSystemd,
    pub containerd: LazyContainerd,
    pub host: FsHost,
    pub settings: RunnerSettings,
}

/// What the executor is given from the configuration besides its effects.
#[derive(Clone, Debug, Default)]
pub struct RunnerSettings {
    /// The node images (the executor's `node_images`).
    pub node_images: NodeImages,
    /// The drain before a disruption (the core's `Policy::drain`).
    pub drain: DrainPolicy,
}

impl RunnerSettings {
    fn apply<S: Systemd, C: Containerd, H: Host, P: Publisher, K: Clock>(
        self,
        runner: &mut Runner<S, C, H, P, K>,
    ) {
        runner.set_node_images(self.node_images);
        runner.set_policy(Policy {
            drain: self.drain,
            ..Policy::default()
        });
    }
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
    // In a container, the host's files are reached under its root, never through a link
    // that leads back into the container's own.
    let (layout, unit_dir) = match host_root() {
        None => (HostLayout::at("/"), PathBuf::from(DEFAULT_UNIT_DIR)),
        Some(root) => (
            HostLayout::confined(&root)?,
            resolve_in_root(&root, Path::new(DEFAULT_UNIT_DIR))?,
        ),
    };
    let mut host = FsHost::new(layout).with_fetcher(ArchiveFetcher::new().with_trust(trust));
    if let Some(node) = &config.node {
        let (server, ca_pem) = crate::config::kubeconfig_cluster(&config.kubeconfig)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        // Validation makes a node's settings come with one of the two.
        let plugin = kube::config::Kubeconfig::read_from(&config.kubeconfig)
            .ok()
            .as_ref()
            .and_then(crate::config::kubeconfig::token_plugin);
        let credential = match (plugin, &config.bootstrap_token_file) {
            (Some(args), _) => KubeletSource::Exec(
                kubelet_plugin(&args, Path::new("/proc/self/exe"))
                    .map_err(|e| anyhow::anyhow!("the kubelet's credential: {e}"))?,
            ),
            (None, Some(token_file)) => KubeletSource::BootstrapTokenFile(token_file.clone()),
            (None, None) => anyhow::bail!("the kubelet has no credential: no bootstrapTokenFile"),
        };
        host = host.with_kubelet(KubeletInputs {
            node_name: config.node_name.clone(),
            server,
            ca_pem,
            credential,
            trusted_ca_file: config.trusted_ca_file.clone(),
            registry_credentials_file: config.registry_credentials_file.clone(),
            sandbox_image: node.sandbox_image.clone(),
            sandbox_image_archive: node
                .sandbox_image_archive
                .as_deref()
                .map(|p| on_host(&p.to_string_lossy())),
            pod_cidr: node.pod_cidr.clone(),
            tuning: node.kubelet.clone(),
        });
    }
    Ok(HostEffects {
        systemd: systemd.with_unit_dir(unit_dir),
        containerd: LazyContainerd::new(CONTAINERD_SOCKET, DEFAULT_NAMESPACE, registry),
        host,
        settings: RunnerSettings {
            // An offline node's archives are host paths: under the host's root in a container.
            node_images: config
                .node
                .as_ref()
                .map(|n| NodeImages {
                    archive: n
                        .images
                        .archive
                        .as_deref()
                        .map(|a| on_host(a).display().to_string()),
                    ..n.images.clone()
                })
                .unwrap_or_default(),
            drain: config.drain.clone(),
        },
    })
}

/// The host's root as this process sees it when it runs in a container of the agent's image.
pub fn host_root() -> Option<PathBuf> {
    std::env::var_os(HOST_ROOT_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// A host path as this process reaches it (under [`host_root`] in a container).
pub fn on_host(path: &str) -> PathBuf {
    match host_root() {
        None => PathBuf::from(path),
        Some(root) => resolve_in_root(&root, Path::new(path)).unwrap_or_else(|_| root.join(path)),
    }
}

/// The daemon's executor: `systemd`, `containerd` and `host` with the API server as
/// publisher, on the store (waiting while the command that started the daemon holds it).
/// The store must exist: `join` made it, and a daemon that made a new one would forget the
/// node (src/lifecycle/fault.rs, `StoreMissing`).
pub async fn daemon_runner<S: Systemd, C: Containerd, H: Host>(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    (systemd, containerd, host): (S, C, H),
    settings: RunnerSettings,
) -> Result<KubeRunner<S, C, H>, StoreError> {
    if !state.exists() {
        return Err(StoreError::Missing(state.to_path_buf()));
    }
    let publisher = KubePublisher::new(client, node_name);
    // A store that cannot be opened for writing yet (a full disk, a read-only mount) is
    // waited for, reported once; any other error is the caller's.
    let mut told = None;
    let store = loop {
        let e = match Store::open_waiting(state, DAEMON_STORE_PATIENCE).await {
            Ok(store) => break store,
            Err(e) => e,
        };
        let Some(fault) = of_store(&e, state).filter(|f| !f.kind.needs_operator()) else {
            return Err(e);
        };
        if told != Some(fault.kind) {
            fault::tell(&fault, Some(&publisher)).await;
            told = Some(fault.kind);
        }
        notify::ready_while_waiting();
        tokio::time::sleep(STORE_RETRY).await;
    };
    let clock = SteadyClock::system(newest_entry(&store)?);
    let effects = Effects {
        systemd,
        containerd,
        host,
        publisher,
    };
    let mut runner = Runner::new(store, effects, clock);
    settings.apply(&mut runner);
    Ok(runner)
}

/// The time of the store's newest journal entry: the agent's clock never starts before it
/// (src/reconcile/clock.rs).
fn newest_entry(store: &Store) -> Result<Option<Timestamp>, StoreError> {
    Ok(store.journal(1)?.last().map(|e| e.at))
}

/// The executor as a command (not the daemon) runs it.
pub type CommandRunner = Runner<DbusSystemd, LazyContainerd, FsHost, KubePublisher, SteadyClock>;

/// The executor for a command acting for the agent (join, reset, recovery) on `store`: it is
/// not the daemon, and with `resume` it first finishes whatever a crash interrupted.
async fn command_runner(
    store: Store,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
    resume: Resume,
) -> anyhow::Result<CommandRunner> {
    let settings = fx.settings;
    let clock = SteadyClock::system(newest_entry(&store)?);
    let mut runner = Runner::new(
        store,
        Effects {
            systemd: fx.systemd,
            containerd: fx.containerd,
            host: fx.host,
            publisher: KubePublisher::new(client, node_name),
        },
        clock,
    );
    runner.set_daemon(false);
    settings.apply(&mut runner);
    if resume == Resume::First {
        runner.resume().await?;
    }
    // A result the store keeps (an earlier process could not publish it) is published by
    // whichever process holds the store next: a command may be the last one (a reset).
    runner.flush_outbox().await?;
    Ok(runner)
}

/// Join's executor: the store must be free (a second join or a reset would hold it), and
/// one it cannot use is never joined over (`store_failure`).
pub async fn join_runner(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
) -> Result<CommandRunner, super::Failure> {
    let store = Store::open(state).map_err(|e| match e {
        StoreError::Locked(_) => super::Failure::failed(format!(
            "another flexnode process holds {}; is a join or reset running?",
            state.display()
        )),
        e => store_failure(e, state),
    })?;
    Ok(command_runner(store, node_name, client, fx, Resume::First).await?)
}

/// Whether a command's executor finishes an interrupted step before its own first input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    First,
    /// The command's first input decides: a reset supersedes what the core lets it (a drain,
    /// a reboot's restart: src/lifecycle/step/mod.rs, `preempts`) and finishes the rest first.
    ByFirstInput,
}

/// Reset's and recovery's executor: waits while the stopping agent still holds the store.
pub async fn agent_command_runner(
    state: &Path,
    node_name: &str,
    client: kube::Client,
    fx: HostEffects,
    resume: Resume,
) -> anyhow::Result<CommandRunner> {
    let store = Store::open_waiting(state, COMMAND_STORE_PATIENCE).await?;
    command_runner(store, node_name, client, fx, resume).await
}

/// Waits, with reset's and recovery's patience, until no process holds the store (the agent
/// finishing a reset), without keeping it.
pub async fn wait_until_store_free(state: &Path) -> Result<(), StoreError> {
    Store::open_waiting(state, COMMAND_STORE_PATIENCE)
        .await
        .map(drop)
}

/// Which installed build this process is, or `None` when it runs from elsewhere (a copy the
/// operator runs `join` from). In a container: the image its unit names (`AGENT_IMAGE_VAR`).
pub fn running() -> Option<AgentBuild> {
    if host_root().is_some() {
        let image = std::env::var(AGENT_IMAGE_VAR).ok()?;
        return image_ref_digest(&image).map(|digest| AgentBuild::Image { digest });
    }
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

/// How long a daemon's start waits for the certificate that replaces an expired one.
const EXPIRED_REPLACEMENT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The installed configuration (as `join` rendered it) and an API client from it — the
/// agent's certificate replaced first through the bootstrap token if it expired while the
/// node was off — or the fault that keeps it from being used (missing, unreadable, a setting
/// or a credential that cannot work: only an operator fixes those).
pub async fn installed_config(path: &Path) -> Result<(Config, kube::Client), Fault> {
    let config = Config::installed(path, &hostname())?;
    let replaced = crate::identity::bootstrap::replace_expired(
        &config.node_name,
        &config.kubeconfig,
        config.bootstrap_token_file.as_deref(),
        config.agent_certificate_expiration_seconds,
        crate::identity::unix_now(),
        EXPIRED_REPLACEMENT_WAIT,
    )
    .await
    .map_err(|e| {
        Fault::new(
            FaultKind::CertificateExpired,
            &config.kubeconfig,
            e.to_string(),
        )
    })?;
    if let Some(cert) = replaced {
        tracing::info!(
            valid_until = cert.not_after,
            "the agent's expired certificate was replaced through the bootstrap token"
        );
    }
    let client = client_from_kubeconfig(&config.kubeconfig)
        .await
        .map_err(|e| {
            Fault::new(
                FaultKind::ConfigInvalid,
                path,
                format!("kubeconfig {}: {e}", config.kubeconfig.display()),
            )
        })?;
    Ok((config, client))
}

/// Where the node stands, from the store (readable while the agent runs); `None` without one.
pub fn current_state(state: &Path) -> Result<Option<NodeState>, StoreError> {
    match StoreReader::open(state) {
        Ok(reader) => Ok(Some(reader.load()?.state)),
        Err(StoreError::Missing(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// How a command fails on a store error: exit 78 with what to do for a store only an
/// operator can mend (damaged, newer, insecure), which no retry would change.
pub fn store_failure(e: StoreError, state: &Path) -> super::Failure {
    match of_store(&e, state) {
        Some(fault) if fault.kind.needs_operator() => {
            super::Failure::config(format!("{fault}; {}", fault.remedy()))
        }
        Some(fault) => super::Failure::failed(format!("{fault}; {}", fault.remedy())),
        None => e.into(),
    }
}

/// The daemon's client, switched in place to each certificate the agent renews
/// (src/identity/rotation.rs) while a task keeps it renewed; a kubeconfig without a
/// certificate of its own (a token, an exec plugin) is used as it is.
pub fn renewed_client(
    config: &Config,
    client: kube::Client,
) -> (kube::Client, Option<tokio::task::JoinHandle<()>>) {
    if crate::identity::credential::certificate_in(&config.kubeconfig).is_none() {
        return (client, None);
    }
    let (client, swap) = crate::identity::rotation::Swappable::new(client);
    let renewer = crate::identity::rotation::Renewer {
        node: config.node_name.clone(),
        kubeconfig: config.kubeconfig.clone(),
        expiration_seconds: config.agent_certificate_expiration_seconds,
        renew_at: config.renew_at,
    };
    (client, Some(tokio::spawn(renewer.run(swap, |_| {}))))
}
