//! `flexnode join --config FILE`: validate the configuration, check the host and the API
//! server, install the configuration, create or adopt the node's Machine, then let the core
//! join (agent install, units, first machine) and start the agent. Running it again on a
//! joined host converges (configuration, units, a running agent) instead of joining twice.

use crate::api::Machine;
use crate::api::machine::{KubernetesSpec, MachineSpec};
use crate::cli::EXIT_CONFIG;
use crate::config::{CONFIG_PATH, Config, ConfigError, KUBECONFIG_PATH};
use crate::effects::atomic_file::write_file_atomic;
use crate::effects::{AGENT_UNIT, Effects, Systemd};
use crate::exec::{Fed, Runner, SystemClock};
use crate::machine::input::JoinRequest;
use crate::machine::state::{AgentBuild, Goal, Slot};
use crate::machine::validate::Arch;
use crate::machine::{Input, NodeState};
use crate::node_host::{self, HostEffects};
use crate::reconcile::client_from_kubeconfig;
use crate::reconcile::publisher::KubePublisher;
use crate::store::{Store, StoreError};
use kube::api::{Api, PostParams};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `join` waits for the agent it started to report ready.
const AGENT_READY: Duration = Duration::from_secs(180);

enum Failure {
    /// A setting that cannot work: exit 78, the bootstrap unit does not retry.
    Config(ConfigError),
    Other(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Self::Other(e.into())
    }
}

impl crate::cli::CommandError for Failure {
    fn report(&self) -> String {
        match self {
            Self::Config(e) => format!("impossible setting: {e}"),
            Self::Other(e) => format!("{e:#}"),
        }
    }

    fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) => EXIT_CONFIG,
            Self::Other(_) => 1,
        }
    }
}

pub fn run(state: &Path, config: &Path) -> ExitCode {
    crate::cli::block_on("join", join(state, config))
}

async fn join(state: &Path, path: &Path) -> Result<(), Failure> {
    let config = Config::load(path, &node_host::hostname()).map_err(Failure::Config)?;
    node_host::require_root("join")?;
    preflight()?;
    let client = client_from_kubeconfig(&config.kubeconfig)
        .await
        .map_err(|e| Failure::Config(setting("kubeconfig", format!("cannot use it: {e}"))))?;
    let goal = adopt_or_create_machine(&client, &config).await?;
    let fx = node_host::effects().await?;

    if let Some(joined) = joined_as(state)? {
        if joined != config.node_name {
            return Err(Failure::Config(setting(
                "nodeName",
                format!(
                    "this host is already joined as {joined:?}; run `flexnode reset --yes` first"
                ),
            )));
        }
        install_files(&config)?;
        return converge(&fx).await;
    }

    install_files(&config)?;
    let store = Store::open(state).map_err(|e| match e {
        StoreError::Locked(_) => anyhow::anyhow!(
            "another flexnode process holds {}; is a join or reset running?",
            state.display()
        ),
        e => e.into(),
    })?;
    let agent = node_host::running().unwrap_or(AgentBuild::Slot { slot: Slot::Blue });
    let mut runner = Runner::new(
        store,
        Effects {
            systemd: fx.systemd.clone(),
            containerd: fx.containerd,
            host: fx.host,
            publisher: KubePublisher::new(client.clone(), &config.node_name),
        },
        SystemClock,
    );
    runner.daemon = false;
    // An earlier join that died half-way is finished first.
    runner.resume().await?;
    let fed = match runner.state()? {
        NodeState::Unjoined { .. } => {
            runner
                .feed(Input::Join(JoinRequest {
                    node_name: config.node_name.clone(),
                    mode: config.install_mode,
                    arch: Arch::from_rust(std::env::consts::ARCH),
                    goal,
                    agent,
                }))
                .await?
        }
        // A join finished by `resume` (or one the agent is finishing).
        other => Fed::Accepted(Box::new(other)),
    };
    let state_now = match fed {
        Fed::Accepted(s) => *s,
        Fed::Refused(r) => return Err(anyhow::anyhow!("join refused: {r}").into()),
    };
    // Release the store: the agent waits for it.
    drop(runner);
    match state_now {
        NodeState::Ready { .. } => {}
        NodeState::Unjoined { .. } => {
            return Err(anyhow::anyhow!(
                "join failed; `flexnode history` shows why (the host is left unjoined)"
            )
            .into());
        }
        other => {
            return Err(anyhow::anyhow!(
                "join did not finish (state {other}); `flexnode history` shows where it stopped"
            )
            .into());
        }
    }
    wait_for_agent(&fx.systemd).await?;
    println!(
        "flexnode: joined {} (Kubernetes {}); {AGENT_UNIT} is active",
        config.node_name, config.kubernetes_version
    );
    Ok(())
}

/// Host prerequisites a join cannot do without (before anything is changed).
fn preflight() -> anyhow::Result<()> {
    for (path, why) in [
        (
            "/usr/bin/systemd-nspawn",
            "systemd-nspawn (package systemd-container) runs the node's machines",
        ),
        ("/run/systemd/system", "systemd must be the init system"),
    ] {
        anyhow::ensure!(
            Path::new(path).exists(),
            "preflight: {path} is missing: {why}"
        );
    }
    Ok(())
}

fn setting(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: name.into(),
        message: message.into(),
    }
}

/// The node this host is joined as; a join still under way (a crashed one) is not joined yet:
/// it is finished from its recorded intent instead.
fn joined_as(state: &Path) -> anyhow::Result<Option<String>> {
    Ok(node_host::current_state(state)?
        .filter(|s| !matches!(s, NodeState::Joining { .. }))
        .and_then(|s| s.node().map(|n| n.name.clone())))
}

/// The goal comes from the node's Machine; join creates it when there is none.
async fn adopt_or_create_machine(client: &kube::Client, config: &Config) -> Result<Goal, Failure> {
    let api: Api<Machine> = Api::all(client.clone());
    let machine = match api.get_opt(&config.node_name).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            let mut m = Machine::new(
                &config.node_name,
                MachineSpec {
                    kubernetes: Some(KubernetesSpec {
                        version: Some(config.kubernetes_version.clone()),
                        ..KubernetesSpec::default()
                    }),
                    ..MachineSpec::default()
                },
            );
            m.metadata.labels = Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "flexnode".to_string(),
                )]
                .into(),
            );
            match api.create(&PostParams::default(), &m).await {
                Ok(m) => {
                    println!("flexnode: created Machine {}", config.node_name);
                    m
                }
                // Someone created it meanwhile: adopt theirs.
                Err(kube::Error::Api(s)) if s.code == 409 => api.get(&config.node_name).await?,
                Err(e) => return Err(api_failure(e)),
            }
        }
        Err(e) => return Err(api_failure(e)),
    };
    let kubernetes_version = machine
        .spec
        .kubernetes
        .as_ref()
        .and_then(|k| k.version.clone())
        .unwrap_or_else(|| config.kubernetes_version.clone());
    Ok(Goal {
        generation: machine.metadata.generation.unwrap_or(0),
        kubernetes_version,
    })
}

/// A credential the API server refuses cannot start working by retrying; an unreachable API
/// server can.
fn api_failure(e: kube::Error) -> Failure {
    match &e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Failure::Config(setting(
            "kubeconfig",
            format!("the API server refused the credential: {}", s.message),
        )),
        _ => Failure::Other(anyhow::anyhow!("API server: {e}")),
    }
}

/// `/etc/flexnode/config.yaml` and the credential, 0600, written atomically.
fn install_files(config: &Config) -> anyhow::Result<()> {
    let dir = Path::new(CONFIG_PATH)
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no config directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    if config.kubeconfig != Path::new(KUBECONFIG_PATH) {
        let credential = std::fs::read(&config.kubeconfig)?;
        write_private(Path::new(KUBECONFIG_PATH), &credential)?;
    }
    let rendered = serde_saphyr::to_string(&config.rendered())
        .map_err(|e| anyhow::anyhow!("render config: {e}"))?;
    write_private(
        Path::new(CONFIG_PATH),
        format!("# Written by `flexnode join`; see docs/config.md.\n{rendered}").as_bytes(),
    )
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(write_file_atomic(path, bytes, 0o600)?)
}

/// A joined host: units as this build ships them, the agent enabled and running.
async fn converge(fx: &HostEffects) -> Result<(), Failure> {
    for (name, contents) in crate::units::for_mode(crate::machine::state::InstallMode::Host) {
        fx.systemd.write_unit(name, contents).await?;
    }
    fx.systemd.daemon_reload().await?;
    fx.systemd.enable(AGENT_UNIT).await?;
    if fx.systemd.active_since(AGENT_UNIT).await?.is_none() {
        fx.systemd.start_no_wait(AGENT_UNIT).await?;
    }
    wait_for_agent(&fx.systemd).await?;
    println!("flexnode: already joined; configuration and units converged, {AGENT_UNIT} is active");
    Ok(())
}

async fn wait_for_agent(systemd: &impl Systemd) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if systemd.active_since(AGENT_UNIT).await?.is_some() {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < AGENT_READY,
            "{AGENT_UNIT} did not become active within {} s; see `journalctl -u {AGENT_UNIT}`",
            AGENT_READY.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
