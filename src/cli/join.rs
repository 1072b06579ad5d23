//! `flexnode join --config FILE`: validate the configuration, check the host and the API
//! server, install the configuration, create or adopt the node's Machine, then let the core
//! join (agent install, units, first machine) and start the agent. Running it again on a
//! joined host converges (configuration, units, a running agent) instead of joining twice.

use super::preflight;
use super::wiring::{self, HostEffects};
use super::{Failure, impossible};
use crate::api::Machine;
use crate::api::machine::{KubernetesSpec, MachineSpec};
use crate::config::kubeconfig::client_from_kubeconfig;
use crate::config::{
    BOOTSTRAP_TOKEN_PATH, CONFIG_PATH, Config, ConfigError, KUBECONFIG_PATH,
    REGISTRY_CREDENTIALS_PATH, TRUSTED_CA_PATH, TokenJoin,
};
use crate::effects::fs::{
    create_parents, ensure_real_dir, remove_no_follow, remove_tree, sync_existing_dir,
    write_file_atomic,
};
use crate::effects::host::{AGENT_IMAGE_VAR, RUNTIME_DIR_MODE};
use crate::effects::{AGENT_UNIT, Containerd, Systemd};
use crate::exec::{Fed, start_agent, write_units};
use crate::identity::bootstrap::{BootstrapError, Obtained, TokenRequest, by_token};
use crate::identity::credential::read_token;
use crate::identity::request::{Progress, RequestError};
use crate::identity::unix_now;
use crate::ignition::BOOTSTRAP_DIR;
use crate::lifecycle::agent::{AgentBuild, Arch, InstallMode, Slot};
use crate::lifecycle::fault::{Fault, FaultKind};
use crate::lifecycle::input::JoinRequest;
use crate::lifecycle::state::Goal;
use crate::lifecycle::{Input, NodeState};
use crate::store::StoreError;
use crate::store::fault::{probe_dir, read_only};
use kube::api::{Api, PostParams};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `join` waits for the agent it started to report ready.
const AGENT_READY: Duration = Duration::from_secs(180);

/// The first retry's delay under `--backoff`, doubled per failure up to the cap.
const BACKOFF_FIRST: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

pub fn run(state: &Path, config: &Path, backoff: bool, ignore: &[String]) -> ExitCode {
    super::block_on("join", async move {
        let failures = state.with_file_name("bootstrap-failures");
        if backoff {
            wait_out_failures(&failures).await;
        }
        let result = join(state, config, ignore).await;
        if backoff {
            record_attempt(&failures, &result);
        }
        result
    })
}

/// systemd 252 has no growing `RestartSec`: the failures the bootstrap unit's attempts met
/// are counted in a file beside the store, and each retry waits longer than the last.
async fn wait_out_failures(failures: &Path) {
    let n = failures_so_far(failures);
    if n == 0 {
        return;
    }
    let delay = BACKOFF_FIRST
        .saturating_mul(1 << (n - 1).min(8))
        .min(BACKOFF_MAX);
    println!(
        "flexnode: {n} earlier attempt(s) failed; trying again in {} s",
        delay.as_secs()
    );
    tokio::time::sleep(delay).await;
}

fn failures_so_far(failures: &Path) -> u32 {
    std::fs::read_to_string(failures)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Success and impossible settings start the count over; other failures add one. A count
/// that cannot be written only costs the delay.
fn record_attempt(failures: &Path, result: &Result<(), Failure>) {
    let outcome = match result {
        Err(f) if f.code != super::EXIT_CONFIG => {
            let n = failures_so_far(failures).saturating_add(1);
            write_file_atomic(failures, format!("{n}\n").as_bytes(), 0o600)
        }
        _ => remove_no_follow(failures),
    };
    if let Err(e) = outcome {
        eprintln!("flexnode join: cannot record the attempt: {e}");
    }
}

async fn join(state: &Path, path: &Path, ignore: &[String]) -> Result<(), Failure> {
    let config = Config::load(path, &wiring::hostname()).map_err(impossible)?;
    let ignore = preflight::ignored(ignore)?;
    let agent = agent_to_install(config.install_mode)?;
    wiring::require_root("join")?;
    let joined = joined_as(state)?.is_some();
    let checks = preflight::run_checks(&config, joined, &ignore).await;
    if let Some(failed) = preflight::failures(&checks) {
        // A refused credential does not start working by retrying: an impossible setting.
        return Err(if preflight::credential_refused(&checks) {
            Failure::config(failed)
        } else {
            Failure::failed(failed)
        });
    }
    writable(state)?;
    after_any_reset(state).await?;
    if let Some(token_join) = &config.token_join {
        agent_certificate(&config, token_join).await?;
    }
    let client = client_from_kubeconfig(&config.kubeconfig)
        .await
        .map_err(|e| {
            impossible(ConfigError::new(
                "kubeconfig",
                format!("cannot use it: {e}"),
            ))
        })?;
    let goal = adopt_or_create_machine(&client, &config).await?;
    let fx = wiring::host_effects(&config).await?;
    // The container units run the image by its local name.
    if let AgentBuild::Image { digest } = &agent {
        fx.containerd.name_agent_image(digest).await?;
    }

    if let Some((joined, mode)) = joined_as(state)? {
        if joined != config.node_name {
            return Err(impossible(ConfigError::new(
                "nodeName",
                format!(
                    "this host is already joined as {joined:?}; run `flexnode reset --yes` first"
                ),
            )));
        }
        install_files(&config)?;
        converge(&fx, mode).await?;
        return remove_bootstrap_inputs(path);
    }

    install_files(&config)?;
    let systemd = fx.systemd.clone();
    // An earlier join that died half-way is finished first.
    let mut runner = wiring::join_runner(state, &config.node_name, client, fx).await?;
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
    wait_for_agent(&systemd).await?;
    println!(
        "flexnode: joined {} (Kubernetes {}); {AGENT_UNIT} is active",
        config.node_name, config.kubernetes_version
    );
    remove_bootstrap_inputs(path)
}

/// How long `join` waits for its certificate request to be approved and signed; the
/// bootstrap unit's next attempt finds the same request and waits on.
const CERTIFICATE_WAIT: Duration = Duration::from_secs(300);

/// A node that joins with a bootstrap token: the agent's certificate (src/identity/), into
/// the kubeconfig every later step uses. A denied request or a refused token is an
/// impossible setting (78): only an operator mends those.
async fn agent_certificate(config: &Config, join: &TokenJoin) -> Result<(), Failure> {
    let read = |setting: &str, path: &Path| {
        std::fs::read(path).map_err(|e| {
            impossible(ConfigError::new(
                setting,
                format!("{}: {e}", path.display()),
            ))
        })
    };
    let ca_pem = read("apiServerCAFile", &join.ca_file)?;
    let token_file = config
        .bootstrap_token_file
        .as_deref()
        .ok_or_else(|| impossible(ConfigError::new("bootstrapTokenFile", "is required")))?;
    let token = read_token(token_file).map_err(|e| {
        impossible(ConfigError::new(
            "bootstrapTokenFile",
            format!("{}: {e}", token_file.display()),
        ))
    })?;
    config_dir()?;
    let request = TokenRequest {
        node: &config.node_name,
        server: &join.server,
        ca_pem: &ca_pem,
        token,
        expiration_seconds: config.agent_certificate_expiration_seconds,
        kubeconfig: &config.kubeconfig,
    };
    let progress = |p: Progress<'_>| match p {
        Progress::Sent { name } => {
            eprintln!("flexnode join: asked the cluster for the agent's certificate (CSR {name})")
        }
        Progress::Waiting {
            name,
            approved,
            waited,
        } => eprintln!(
            "flexnode join: waiting for CSR {name} to be {} ({} s)",
            if approved { "signed" } else { "approved" },
            waited.as_secs()
        ),
    };
    match by_token(request, unix_now(), CERTIFICATE_WAIT, progress).await {
        Ok(Obtained::Kept(_)) => Ok(()),
        Ok(Obtained::New(cert)) => {
            eprintln!(
                "flexnode join: the agent's certificate for {} is valid until {}",
                cert.common_name,
                crate::lifecycle::Timestamp::from_millis(cert.not_after.saturating_mul(1000))
            );
            Ok(())
        }
        Err(BootstrapError::Request(e)) if e.refused() => Err(impossible(ConfigError::new(
            "bootstrapTokenFile",
            format!(
                "the API server refused the bootstrap token ({e}): it may have expired or been \
                 deleted; create one bound to this node (docs/config.md)"
            ),
        ))),
        Err(BootstrapError::Request(e @ RequestError::Denied { .. })) => {
            Err(impossible(ConfigError::new(
                "bootstrapTokenFile",
                format!(
                    "{e}; the token must be bound to this node (auth-extra-groups \
                     system:bootstrappers:flexnode:{}, docs/config.md)",
                    config.node_name
                ),
            )))
        }
        Err(e) => Err(Failure::failed(format!("the agent's certificate: {e}"))),
    }
}

/// The first build: on the host install this executable (copied into a slot); on the
/// container install the image this process runs in, which only its bootstrap unit (or an
/// operator's `ctr run` of the same shape) provides.
fn agent_to_install(mode: InstallMode) -> Result<AgentBuild, Failure> {
    match (mode, wiring::host_root().is_some(), wiring::running()) {
        (InstallMode::Host, false, running) => {
            Ok(running.unwrap_or(AgentBuild::Slot { slot: Slot::Blue }))
        }
        (InstallMode::Container, true, Some(image @ AgentBuild::Image { .. })) => Ok(image),
        (InstallMode::Container, true, _) => Err(impossible(ConfigError::new(
            "installMode",
            format!(
                "this container does not say which image it runs ({AGENT_IMAGE_VAR}=…@sha256:…)"
            ),
        ))),
        (InstallMode::Container, false, _) => Err(impossible(ConfigError::new(
            "installMode",
            "a container install joins from a container of the agent's image: its bootstrap \
             unit (`flexnode ignition`) runs this join",
        ))),
        (InstallMode::Host, true, _) => Err(impossible(ConfigError::new(
            "installMode",
            "\"host\" installs the agent on the host; from a container, use \"container\"",
        ))),
    }
}

/// Where join writes must take writes: `/etc` (configuration, units, machine settings) and
/// the store's filesystem. Checked before anything changes; both can pass (a remount, space
/// freed), so the failure is an ordinary one the bootstrap unit retries, saying why.
fn writable(state: &Path) -> Result<(), Failure> {
    let etc = wiring::on_host("/etc");
    let store_dir = state
        .ancestors()
        .skip(1)
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    let found = [
        read_only(&etc).then(|| Fault::new(FaultKind::EtcReadOnly, &etc, "")),
        probe_dir(store_dir).map(|kind| Fault::new(kind, store_dir, "")),
    ];
    match found.into_iter().flatten().next() {
        Some(fault) => Err(Failure::failed(format!(
            "preflight: {fault}; {}",
            fault.remedy()
        ))),
        None => Ok(()),
    }
}

/// The container install's bootstrap inputs (a token-bearing kubeconfig among them) go once
/// the node is joined: everything was copied to `/etc/flexnode`, and the bootstrap unit's
/// condition then keeps it from running again.
fn remove_bootstrap_inputs(config: &Path) -> Result<(), Failure> {
    let dir = Path::new(BOOTSTRAP_DIR);
    if config.starts_with(dir) {
        remove_tree(dir)?;
        sync_existing_dir(dir.parent().unwrap_or(Path::new("/")))?;
        println!("flexnode: removed the bootstrap inputs ({BOOTSTRAP_DIR})");
    }
    Ok(())
}

/// A reset still under way finishes before the join: its operation reads `Complete` before
/// the agent has uninstalled itself, and a join meanwhile would install what the reset then
/// removes (and start an agent whose binary is gone). The agent finishing it holds the store;
/// a reset that no process is finishing (interrupted) is `flexnode reset`'s to finish.
async fn after_any_reset(state: &Path) -> Result<(), Failure> {
    let resetting = || -> Result<Option<NodeState>, Failure> {
        Ok(wiring::current_state(state)
            .map_err(|e| wiring::store_failure(e, state))?
            .filter(|s| matches!(s, NodeState::Resetting { .. })))
    };
    if resetting()?.is_none() {
        return Ok(());
    }
    println!("flexnode: a reset is under way; waiting for it to finish");
    wiring::wait_until_store_free(state)
        .await
        .map_err(|e| match e {
            StoreError::Locked(_) => Failure::failed(format!(
                "the reset under way still holds {}; join again once it has finished",
                state.display()
            )),
            e => wiring::store_failure(e, state),
        })?;
    match resetting()? {
        None => Ok(()),
        Some(s) => Err(Failure::failed(format!(
            "a reset was interrupted (state {s}); `flexnode reset --yes` finishes it, then join again"
        ))),
    }
}

/// The node this host is joined as, and its install mode; a join still under way (a crashed
/// one) is not joined yet: it is finished from its recorded intent instead. A store it cannot
/// read is never joined over (exit 78: src/lifecycle/fault.rs says what to do).
fn joined_as(state: &Path) -> Result<Option<(String, InstallMode)>, Failure> {
    let current = wiring::current_state(state).map_err(|e| wiring::store_failure(e, state))?;
    // The agent's units without a store: a join would start a node afresh over an install it
    // knows nothing of (which side runs, what was under way). Only `join` makes a store, and
    // before any unit, so this is a store lost, not a join to finish.
    if current.is_none() && wiring::on_host(&format!("/etc/systemd/system/{AGENT_UNIT}")).exists() {
        let fault = Fault::new(FaultKind::StoreMissing, state, "");
        return Err(Failure::config(format!("{fault}; {}", fault.remedy())));
    }
    Ok(current
        .filter(|s| !matches!(s, NodeState::Joining { .. }))
        .and_then(|s| s.node().map(|n| (n.name.clone(), n.mode))))
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
    Ok(crate::reconcile::address::goal(
        &machine,
        &config.kubernetes_version,
    ))
}

/// A credential the API server refuses cannot start working by retrying; an unreachable API
/// server can.
fn api_failure(e: kube::Error) -> Failure {
    match &e {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => impossible(ConfigError::new(
            "kubeconfig",
            format!("the API server refused the credential: {}", s.message),
        )),
        _ => Failure::failed(format!("API server: {e}")),
    }
}

/// `/etc/flexnode/config.yaml` and the files it names (credential, CA, registry credentials,
/// bootstrap token), 0600, written atomically, in a 0700 directory (one that exists is made
/// so); and the units' documentation.
fn install_files(config: &Config) -> anyhow::Result<()> {
    let dir = config_dir()?;
    crate::units::write_doc(dir)?;
    let copies = [
        (Some(&config.kubeconfig), KUBECONFIG_PATH),
        (config.trusted_ca_file.as_ref(), TRUSTED_CA_PATH),
        (
            config.registry_credentials_file.as_ref(),
            REGISTRY_CREDENTIALS_PATH,
        ),
        (config.bootstrap_token_file.as_ref(), BOOTSTRAP_TOKEN_PATH),
    ];
    for (from, to) in copies {
        if let Some(from) = from
            && from != Path::new(to)
        {
            write_private(Path::new(to), &std::fs::read(from)?)?;
        }
    }
    let rendered = serde_saphyr::to_string(&config.rendered())
        .map_err(|e| anyhow::anyhow!("render config: {e}"))?;
    write_private(
        Path::new(CONFIG_PATH),
        format!("# Written by `flexnode join`; see docs/config.md.\n{rendered}").as_bytes(),
    )
}

/// `/etc/flexnode`, made 0700 (one that exists is made so).
fn config_dir() -> anyhow::Result<&'static Path> {
    let dir = Path::new(CONFIG_PATH)
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no config directory"))?;
    create_parents(dir)?;
    ensure_real_dir(dir, RUNTIME_DIR_MODE)?;
    Ok(dir)
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    Ok(write_file_atomic(path, bytes, 0o600)?)
}

/// A joined host: its install mode's units as this build ships them, the agent enabled and
/// running — the core's `WriteUnits` and `StartAgent`, without the store the daemon holds.
async fn converge(fx: &HostEffects, mode: InstallMode) -> Result<(), Failure> {
    write_units(&fx.systemd, mode).await?;
    start_agent(&fx.systemd).await?;
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
