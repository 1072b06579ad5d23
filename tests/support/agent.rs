//! A node agent for tests: a joined store, a simulated host and the real daemon as a task,
//! talking to a lab control plane with the node's own credential.

use super::Lab;
use flexnode::api::Machine;
use flexnode::api::MachineOperation;
use flexnode::api::machine::{KubernetesSpec, MachineSpec};
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind};
use flexnode::config::kubeconfig::client_from_kubeconfig;
use flexnode::exec::Clock;
use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::reconcile::DaemonConfig;
use flexnode::sim::SimHost;
use flexnode::sim::SimNode;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// One node: its store, its simulated host, and its daemon task.
pub struct Agent {
    pub name: String,
    pub store: PathBuf,
    pub host: SimHost,
    client: Client,
    config: DaemonConfig,
    /// The clock and policy the daemon runs with (default: the system's, the defaults).
    pub clock: Option<flexnode::reconcile::clock::SteadyClock>,
    pub policy: Option<flexnode::lifecycle::policy::Policy>,
    task: Option<tokio::task::JoinHandle<Result<(), flexnode::exec::ExecError>>>,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// Joins (simulated host) and starts the daemon.
    pub async fn join(lab: &Lab, name: &str, mode: InstallMode) -> Self {
        let config = DaemonConfig {
            node_name: name.into(),
            tick: Duration::from_millis(300),
            ..Default::default()
        };
        let dir = tempfile::tempdir().expect("tmp");
        Self::join_with(agent_client(lab, name).await, dir, mode, config).await
    }

    /// The same with this client, its store in `dir`, and the daemon run as `config` says.
    pub async fn join_with(
        client: Client,
        dir: tempfile::TempDir,
        mode: InstallMode,
        config: DaemonConfig,
    ) -> Self {
        let name = config.node_name.clone();
        let store = dir.path().join("state/state.db");
        let mut sim = SimNode::new(&store, Timestamp::from_millis(1_785_578_400_000));
        sim.join(mode, &name).await.expect("join");
        // The daemon runs on the wall clock: so does the simulated host from now on.
        let mut host = sim.host.clone();
        host.set_time_source(|| flexnode::exec::SystemClock.now());
        let mut agent = Self {
            name,
            store,
            host,
            client,
            config,
            clock: None,
            policy: None,
            task: None,
            _dir: dir,
        };
        agent.start();
        agent
    }

    /// The daemon's watches' account of themselves (lists, interruptions, resyncs).
    pub fn counters(&self) -> std::sync::Arc<flexnode::reconcile::WatchCounters> {
        self.config.counters.clone()
    }

    /// The daemon task is still running.
    pub fn running(&self) -> bool {
        self.task.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// systemd starts the agent unit: the selected build runs the daemon.
    pub fn start(&mut self) {
        let (running, _) = self.host.selected_build().expect("an agent is selected");
        self.host.agent_started();
        let config = self.config.clone();
        let (client, host, store) = (self.client.clone(), self.host.clone(), self.store.clone());
        let (clock, policy) = (self.clock.clone(), self.policy.clone());
        self.task = Some(tokio::spawn(async move {
            let mut runner = flexnode::cli::wiring::daemon_runner(
                &store,
                &config.node_name,
                client.clone(),
                (host.clone(), host.clone(), host.clone()),
                Default::default(),
            )
            .await
            .expect("the daemon's store");
            if let Some(clock) = clock {
                runner.set_clock(clock);
            }
            if let Some(policy) = policy {
                runner.set_policy(policy);
            }
            let result =
                flexnode::reconcile::run(config, client, runner, running, std::future::pending())
                    .await;
            // The process exits: its unit is no longer active.
            host.agent_exited();
            result
        }));
    }

    /// Stands for the process killed: its task is aborted at its next await, so no further
    /// step of it runs. Not a SIGKILL: the task's values are dropped (a store transaction
    /// rolled back, a connection closed: what SQLite and the kernel do after a SIGKILL too,
    /// but in the same process). Real SIGKILLs: the crash simulation's child deaths
    /// (tests/crash_simulation/) and the power cuts of the suites.
    pub async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }

    pub async fn restart(&mut self) {
        self.kill().await;
        self.start();
    }

    /// Fires the transient restart timer the old daemon scheduled.
    pub async fn fire_restart_timer(&mut self) -> bool {
        let timers = std::mem::take(&mut self.host.world().restart_timers);
        if timers.is_empty() {
            return false;
        }
        self.restart().await;
        true
    }

    /// Waits for the daemon task to end by itself (a simulated crash ends it).
    pub async fn wait_exit(&mut self) {
        if let Some(t) = self.task.take() {
            let r = tokio::time::timeout(Duration::from_secs(30), t).await;
            assert!(r.is_ok(), "daemon did not exit");
        }
    }
}

/// Applies the agents' RBAC and admission policies. It does not wait until the policies are
/// in force (the API server loads them asynchronously): tests of what they refuse retry.
pub fn apply_rbac(lab: &Lab) {
    let rbac = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/rbac");
    let (ok, out) = lab.kubectl(&["apply", "-f", &rbac.display().to_string()]);
    assert!(ok, "{out}");
}

/// The node's own least-privilege identity (`system:flexnode:<node>`).
pub async fn agent_client(lab: &Lab, node: &str) -> Client {
    client_from_kubeconfig(&lab.node_kubeconfig(node))
        .await
        .expect("agent client")
}

pub async fn admin(lab: &Lab) -> Client {
    super::logs::init();
    client_from_kubeconfig(&lab.kubeconfig())
        .await
        .expect("admin client")
}

/// A NodeReboot addressed to `node` by name.
pub fn node_reboot(name: &str, node: &str) -> MachineOperation {
    MachineOperation::new(
        name,
        MachineOperationSpec {
            machine_ref: Some(node.into()),
            operation_kind: OperationKind::NodeReboot,
            ..Default::default()
        },
    )
}

pub async fn create_node_and_machine(client: &Client, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.metadata.labels = Some(labels.clone());
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node");
    let mut m = Machine::new(
        name,
        MachineSpec {
            kubernetes: Some(KubernetesSpec {
                version: Some("v1.34.2".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    m.metadata.labels = Some(labels);
    Api::<Machine>::all(client.clone())
        .create(&PostParams::default(), &m)
        .await
        .expect("machine");
}
